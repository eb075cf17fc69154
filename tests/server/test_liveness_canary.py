"""A tritonserver, or a stub, that hangs without exiting, against the real launcher under load
(serving/launcher/canary.py): the canary finds a hung tritonserver, /live says so, and the launcher kills it and
starts it again as after a crash; it finds a hung stub of the model itself, and the launcher kills that stub for the
watchdog to reload, tritonserver untouched; and with engine.options.shared_process, a hung engine process of the
stubs is replaced."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import pytest

from client.core import TextClient
from loadtest.faults import engine_process_fault, launcher_live
from loadtest.reliability import Load
from model_repository.generate import generate
from serving.launcher.canary import STATISTICS_TIMEOUT_S
from serving.launcher.harness import Launcher
from serving.launcher.procfs import running
from serving.launcher.triton_command import Ports
from settings import load_settings

INTERVAL_S, TIMEOUT_S = 0.5, 2.0
SLACK_S = 3.0  # a round's own calls and the poll, on 2 busy cores
EITHER = "(ensemble|ensemble-query)"  # the model, or its query lane


CANARY = [f"server.canary_interval_s={INTERVAL_S}", f"server.canary_timeout_s={TIMEOUT_S}"]


@contextlib.contextmanager
def running_launcher(settings, repository, tmp_path, overrides=()):
    started = Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log", [*CANARY, *overrides])
    yield started.start()
    started.terminate()  # a drain: the launcher reaps tritonserver and removes its stubs' regions, a killed one's too
    try:
        started.process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        started.kill()


@pytest.fixture()
def launcher(settings, repository, tmp_path):
    with running_launcher(settings, repository, tmp_path) as started:
        yield started


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
    # A round's canary runs into its deadline, then the statistics call into its own.
    bound_s = INTERVAL_S + TIMEOUT_S + min(TIMEOUT_S, STATISTICS_TIMEOUT_S) + SLACK_S
    assert status == 503 and found_s < bound_s, (found_s, body, log[-3000:])
    # The model and its query lane are both probed: whichever's canary runs out first names the hang.
    hung = [p for p in body["problems"] if re.match(rf"tritonserver hung: {EITHER}: no good canary answer", p)]
    assert body["live"] is False and hung and hung[0].endswith("did not answer its statistics either"), body
    deadline = time.monotonic() + 120
    while launcher.ready()[0] != 200 or launcher.triton_pid == stopped:
        assert time.monotonic() < deadline, launcher.log_path.read_text()[-3000:]
        time.sleep(0.1)
    load.stop()
    log = launcher.log_path.read_text()
    assert re.search(rf"tritonserver is hung: {EITHER}: no good canary answer for", log)
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


def test_a_stopped_stub_of_the_model_is_found_hung_and_reloaded(launcher, settings):
    """The model's own stub, not its lane's: alive, so the watchdog does not see it, while its requests wait. The
    canary finds the model answering nothing, the launcher kills the stub, the watchdog reloads the model; the
    load's calls that the stub held are retried, and tritonserver is never restarted."""
    load = Load(f"127.0.0.1:{launcher.ports.grpc}", 2, settings.tokenizer.max_text_bytes).start()
    time.sleep(2 * INTERVAL_S + 1)
    triton = launcher.triton_pid
    (stub,) = launcher.stub_pids("ensemble")
    os.kill(stub, signal.SIGSTOP)
    stopped = time.monotonic()
    while running(stub) and time.monotonic() - stopped < 30:
        time.sleep(0.05)
    found_s = time.monotonic() - stopped
    log = launcher.log_path.read_text()
    assert found_s < INTERVAL_S + TIMEOUT_S + SLACK_S, (found_s, log[-3000:])
    assert "ensemble's stubs are hung: ensemble: no good canary answer for" in log
    assert "it answered no request since its last good canary; SIGKILL" in log  # or Triton's "not healthy"
    deadline = time.monotonic() + 120
    while launcher.ready()[0] != 200 or launcher.stub_pids("ensemble") in ([], [stub]):
        assert time.monotonic() < deadline, launcher.log_path.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(1)  # the load is served by the reloaded stub
    load.stop()
    assert launcher.triton_pid == triton and launcher_live(launcher.ports.health)[0] == 200
    ready = launcher.ready()[1]
    assert ready["tritonserver_restarts"] == 0 and ready["stub_restarts"][-1]["model"] == "ensemble", ready
    assert 'bert_launcher_stub_hangs_total{model="ensemble"} 1' in launcher.metrics()
    assert "bert_launcher_tritonserver_hangs_total 0" in launcher.metrics()
    tally = load.tally("steady", 0, time.monotonic())
    assert tally["lost"] == 0 and tally["refused"] == {}, (tally, load.examples)
    assert tally["succeeded"] > 0


def test_a_stopped_engine_process_is_found_hung_and_replaced(settings, exported, tmp_path):
    """With one engine process for the stubs, every stub of the model waits on it: stopped, the canary finds the
    model answering nothing and has its stubs reloaded, and the first reloaded stub to connect finds the process
    silent, ends it and starts another (stages/engines/shared.py). Nothing of the load is lost."""
    shared = ["engine.options={shared_process=true}"]
    repository = generate(load_settings(settings.path, shared), exported, tmp_path / "repository")
    with running_launcher(settings, repository, tmp_path, shared) as launcher:
        load = Load(f"127.0.0.1:{launcher.ports.grpc}", 2, settings.tokenizer.max_text_bytes).start()
        time.sleep(2 * INTERVAL_S + 1)
        event = engine_process_fault(launcher, signal.SIGSTOP, timeout_s=120)
        time.sleep(1)  # the load is served by the new process
        load.stop()
        log = launcher.log_path.read_text()
        restarts = launcher.ready()[1]["tritonserver_restarts"]
    (stopped,) = event["engine_pids"]
    assert not running(stopped) and event["replaced_by"] and stopped not in event["replaced_by"], event
    assert re.search(rf"{EITHER}'s stubs are hung", log) and restarts == 0, log[-3000:]
    tally = load.tally("steady", 0, time.monotonic())
    assert tally["lost"] == 0 and tally["refused"] == {}, (tally, load.examples)
    assert tally["succeeded"] > 0
