"""Faults under load against the real launcher (tritonserver + stub watchdog + /ready + drain on SIGTERM).

The scenarios are loadtest/reliability.py's, the script behind the README's reliability table, run short.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.core import RetryPolicy, TextClient
from loadtest import reliability
from model_repository.generate import generate, python_models
from model_repository.server import Ports
from model_repository.settings import load_settings


@pytest.fixture()
def launcher(settings, repository, tmp_path):
    started = reliability.Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log").start()
    yield started
    started.kill()


@pytest.mark.parametrize("topology", ["one_stage", "two_stage"])
def test_faults_under_load_lose_nothing_and_recover(settings, exported, tmp_path, topology):
    # A shorter drain bound: the load below ignores /ready, so the drain waits all of it before SIGTERM.
    fast = tmp_path / "settings.toml"
    text, count = re.subn(r"^exit_timeout_s = \d+", "exit_timeout_s = 3", settings.path.read_text(), flags=re.M)
    text, topologies = re.subn(r'^topology = "auto"', f'topology = "{topology}"', text, flags=re.M)
    assert count == 1 and topologies == 1
    fast.write_text(text)
    settings = load_settings(fast)
    repository = generate(settings, exported, tmp_path / "model_repository")
    result = reliability.run(fast, repository, tmp_path, users=4, phase_s=2.0)
    phases = result["phases"]
    assert list(phases) == ["steady", "restart", *(f"kill-{model}" for model in python_models(settings))]
    for name, phase in phases.items():
        assert phase["lost"] == 0, name
        assert phase["succeeded"] > 0, name
        # Only the deliberate bad requests are refused: the client rides out stub restarts and the restart.
        assert set(phase["refused"]) <= {"invalid_argument"}, (name, result["refusal_examples"])
    for model in python_models(settings):
        event = phases[f"kill-{model}"]["event"]
        assert event["ready_503_seen"] and any(model in problem for problem in event["problems_reported"])
        assert event["watchdog_reload_s"] is not None and event["stubs_after"] >= 1
    restart = phases["restart"]["event"]
    assert restart["launcher_exit_code"] == 0 and restart["drain_s"] < 2 * 3 + 5


def test_sigterm_drains_requests_in_flight(launcher):
    """Requests running when SIGTERM arrives are answered; /ready turns 503 at once; the launcher exits 0."""
    texts = [" ".join(["drain"] * 200)] * 32  # long texts: each request keeps the server busy a while
    outcomes: list[str] = []

    def send() -> None:
        with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", timeout_s=60, retry=RetryPolicy(attempts=1)) as c:
            outcomes.append("ok" if c.embed(texts).shape == (32, 384) else "bad shape")

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    launcher.terminate()
    time.sleep(0.2)
    status, body = launcher.ready()
    assert status == 503 and any("draining" in problem for problem in body["problems"]), body
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == ["ok"] * 8
    assert launcher.process.wait(timeout=30) == 0


def test_repository_api_is_only_open_to_the_launcher(launcher):
    """Explicit model control (for the watchdog) must not let any client unload the service."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{launcher.ports.http}/v2/repository/models/ensemble/unload", data=b"{}", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{launcher.ports.grpc}")
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("ensemble")
    assert client.is_model_ready("ensemble")


def test_live_and_ready_endpoints(launcher):
    for path in ("/live", "/ready"):
        with urllib.request.urlopen(f"http://127.0.0.1:{launcher.ports.health}{path}", timeout=5) as response:
            assert response.status == 200 and json.loads(response.read())[path[1:]] is True
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{launcher.ports.health}/other", timeout=5)
    assert missing.value.code == 404


def test_launcher_exits_when_tritonserver_dies(launcher):
    """A dead tritonserver is not papered over: the launcher exits 128 + signal, so the container restarts."""
    os.kill(launcher.triton_pid, signal.SIGKILL)
    assert launcher.process.wait(timeout=30) == 128 + signal.SIGKILL
