"""A tritonserver that hangs without exiting, against the real launcher under load: the canary finds it, /live
says so, and the launcher kills it and starts it again as after a crash (serving/launcher/canary.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from client.core import TextClient
from loadtest.reliability import Load
from loadtest.faults import launcher_live
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports

INTERVAL_S, TIMEOUT_S = 0.5, 2.0
SLACK_S = 3.0  # a round's own calls and the poll, on 2 busy cores


@pytest.fixture()
def launcher(settings, repository, tmp_path):
    overrides = [f"server.canary_interval_s={INTERVAL_S}", f"server.canary_timeout_s={TIMEOUT_S}"]
    started = Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log", overrides).start()
    yield started
    started.kill()


def test_a_stopped_tritonserver_is_found_hung_killed_and_started_again(launcher, settings):
    load = Load(f"127.0.0.1:{launcher.ports.grpc}", 2, settings.tokenizer.max_text_bytes).start()
    time.sleep(2 * INTERVAL_S + 1)  # canaries pass under load: no hang while it serves
    assert launcher_live(launcher.ports.health) == (200, {"live": True, "problems": [], "tritonserver_restarts": 0})
    stopped = launcher.triton_pid
    os.kill(stopped, signal.SIGSTOP)  # alive, answering nothing: what a hung Triton looks like
    signalled = time.monotonic()
    while (answer := launcher_live(launcher.ports.health))[0] == 200 and time.monotonic() - signalled < 30:
        time.sleep(0.05)
    found_s = time.monotonic() - signalled
    log = launcher.log_path.read_text()
    status, body = answer
    assert status == 503 and found_s < INTERVAL_S + TIMEOUT_S + SLACK_S, (found_s, body, log[-3000:])
    assert body["live"] is False and any("tritonserver hung: ensemble-query:" in p for p in body["problems"]), body
    deadline = time.monotonic() + 120
    while launcher.ready()[0] != 200 or launcher.triton_pid == stopped:
        assert time.monotonic() < deadline, launcher.log_path.read_text()[-3000:]
        time.sleep(0.1)
    load.stop()
    log = launcher.log_path.read_text()
    assert "tritonserver is hung: ensemble-query: no good canary answer for" in log
    assert "tritonserver exited with signal SIGKILL" in log  # then the crash path: backoff, restart
    assert not os.path.exists(f"/proc/{stopped}"), "the stopped tritonserver was killed and reaped"
    assert launcher.ready()[1]["tritonserver_restarts"] == 1
    assert "bert_launcher_tritonserver_hangs_total 1" in launcher.metrics()
    assert launcher_live(launcher.ports.health)[0] == 200
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", timeout_s=30) as client:
        assert client.embed(["served again"]).shape == (1, 384)
    tally = load.tally("steady", 0, time.monotonic())
    assert tally["lost"] == 0 and tally["refused"] == {}, (tally, load.examples)
    assert tally["succeeded"] > 0
