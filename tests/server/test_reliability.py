"""Faults under load against the real launcher (tritonserver + stub watchdog + /ready + drain on SIGTERM).

The scenarios are loadtest/reliability.py's, the script behind docs/reliability.md's tables, run short."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.core import RetryPolicy, TextClient
from loadtest import reliability
from model_repository.configs import python_models
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.procfs import child_processes, running, stub_argvs, stubs
from serving.launcher.shm import SHM_REGION_PREFIX
from serving.launcher.triton_command import Ports
from serving.workers import STOP_WAIT_S
from settings import Deployment, load_settings
from tests.support import scrape


@pytest.fixture()
def launcher(settings, repository, tmp_path):
    started = Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log").start()
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
    result = reliability.run([fast], repository, tmp_path, users=4, phase_s=2.0)
    stages = python_models(settings, Deployment.of(settings).names(settings))
    phases = result["phases"]
    assert list(phases) == [
        *reliability.PHASES,
        *(f"kill-{model}" for model in stages),
    ]
    for name, phase in phases.items():
        assert phase["lost"] == 0, name
        assert phase["succeeded"] > 0, name
        # The API front's load (coalesced calls) is counted apart, and served through every fault too.
        assert list(phase["models"]) == ["ensemble", "ensemble (api)"], name
        assert phase["models"]["ensemble (api)"]["succeeded"] > 0, name
        # No good request is refused (the client rides out stub restarts and the restart), and every bad one is.
        assert phase["refused"] == {}, (name, result["refusal_examples"])
        bad = dict(phase["bad"])
        sent = bad.pop("sent")
        assert bad == ({"invalid_argument": sent} if sent else {}), (name, phase["bad"], result["refusal_examples"])
    assert result["total"]["bad"]["sent"] > 0
    for model in stages:
        event = phases[f"kill-{model}"]["event"]
        assert event["ready_503_seen"] and any(model in problem for problem in event["problems_reported"])
        assert event["watchdog_reload_s"] is not None and event["stubs_after"] >= 1
    crash = phases["crash-tritonserver"]["event"]
    assert crash["tritonserver_restarts"] == 1 and crash["ready_again_s"] < 60
    hang = phases["hang-tritonserver"]["event"]  # the canary's defaults: found within 5 + 10 s
    assert hang["live_503_after_s"] < 25 and any("hung" in problem for problem in hang["live_problems"]), hang
    assert hang["tritonserver_restarts"] == 2 and hang["ready_again_s"] < 90
    bodies = phases["oversized-bodies"]["event"]
    assert bodies["tritonserver_survived"], bodies
    assert bodies["answers"] == {"413": 8, "400": 1, "404": 1}, "413 over the limit; the 5 MB body is answered"
    for model in stages:
        event = phases[f"kill-{model}"]["event"]
        assert event["stubs_after"] == event["stubs_expected"], event
    restart = phases["restart"]["event"]
    # The drain's design bound: quiet (at most exit_timeout_s); the API front's workers' time to finish what they
    # hold (STOP_WAIT_S); Triton's own exit timeout, which grows by unload_s_per_stub for every stub (the query
    # lane added one); 2 s more for the launcher's own teardown. CI saw 12.7 s.
    deployment = Deployment.of(settings)
    bound_s = deployment.server.exit_timeout_s + STOP_WAIT_S + deployment.triton_exit_timeout_s + 2
    assert restart["launcher_exit_code"] == 0 and restart["drain_s"] < bound_s, (restart, bound_s)
    assert result["final_stop"]["launcher_exit_code"] == 0, result["final_stop"]  # after a stub was replaced


@pytest.mark.parametrize("stop", ["terminate", "interrupt"])
def test_sigterm_and_ctrl_c_drain_every_request_in_flight(launcher, stop):
    """Requests running when SIGTERM reaches the launcher, or Ctrl-C its terminal (SIGINT to its process group;
    tritonserver, in a session of its own, does not see it), are answered; /ready turns 503 at once; exit 0.
    Half go through the API front, whose requests share coalesced calls."""
    texts = [" ".join(["drain"] * 200)] * 32  # long texts: each request keeps the server busy a while
    sent, answered = threading.Semaphore(0), []  # answered: (outcome, when)

    def send() -> None:
        with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", timeout_s=60, retry=RetryPolicy(attempts=1)) as c:
            sent.release()
            answered.append(("ok" if c.embed(texts).shape == (32, 384) else "bad shape", time.monotonic()))

    def send_to_api() -> None:
        body = json.dumps({"input": texts[:8]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{launcher.ports.api}/v1/embeddings", body, {"Content-Type": "application/json"}
        )
        sent.release()
        with urllib.request.urlopen(request, timeout=60) as response:
            rows = json.load(response)["data"]
        answered.append(("ok" if len(rows) == 8 else "bad shape", time.monotonic()))

    threads = [threading.Thread(target=target) for target in [send] * 4 + [send_to_api] * 4]
    for thread in threads:
        thread.start()
    for _ in threads:
        sent.acquire(timeout=60)
    getattr(launcher, stop)()
    signalled = time.monotonic()
    deadline = signalled + 10
    while (ready := launcher.ready())[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    status, body = ready
    assert status == 503 and any("draining" in problem for problem in body["problems"]), (
        body,
        launcher.log_path.read_text()[-3000:],
    )
    for thread in threads:
        thread.join(timeout=60)
    assert [outcome for outcome, _ in answered] == ["ok"] * 8
    # Requests were in flight at the signal: answered after it, so the drain is what answered them.
    assert sum(when > signalled for _, when in answered) >= 1, "every request was answered before the signal"
    assert launcher.process.wait(timeout=60) == 0, launcher.log_path.read_text()[-3000:]


def test_a_sigterm_taken_by_any_thread_of_the_launcher_starts_the_drain(launcher):
    """The kernel hands a process's SIGTERM to any of its threads; Python runs the handler in the main thread, so
    the drain must start even when another thread took the signal while the main thread waits on tritonserver."""
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        pytest.skip("this libc has no tgkill() to send a signal to one thread")
    pid = launcher.process.pid
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert others, "the launcher runs threads beside its main thread (health, metrics, watchdog, fronts)"
    assert tgkill(pid, others[0], signal.SIGTERM) == 0, ctypes.get_errno()
    deadline = time.monotonic() + 5
    while (ready := launcher.ready())[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready[0] == 503 and any("draining" in problem for problem in ready[1]["problems"]), ready
    assert launcher.process.wait(timeout=60) == 0, launcher.log_path.read_text()[-3000:]


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


def shm_regions() -> set[str]:
    return {path.name for path in Path("/dev/shm").glob(f"{SHM_REGION_PREFIX}*")}


def wait_ready(launcher, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = launcher.ready()
        if status == 200:
            return body
        time.sleep(0.2)
    raise AssertionError(f"/ready not 200 within {timeout_s:.0f} s: {launcher.ready()}")


def test_launcher_starts_a_dead_tritonserver_again(launcher):
    """A dead tritonserver is started again: /ready is 503 meanwhile, the restart is counted on /metrics, the
    stubs it left are gone and the service answers again."""
    old_triton = launcher.triton_pid
    old_stubs = launcher.stub_pids("ensemble")
    os.kill(old_triton, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # Until the kernel has ended it, the dying process may read as "not ready" for a moment.
    while "tritonserver is not running" not in (answer := launcher.ready())[1].get("problems", []):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    status, body = answer
    assert status == 503 and "tritonserver is not running" in body["problems"], body
    assert "bert_launcher_tritonserver_metrics_up" in scrape("127.0.0.1", launcher.ports.metrics)  # still answers
    assert wait_ready(launcher)["tritonserver_restarts"] == 1
    after = scrape("127.0.0.1", launcher.ports.metrics)  # the launcher's proxy, before the new tritonserver
    assert "bert_launcher_tritonserver_metrics_up 1" in after and "nv_inference_count" in after
    assert launcher.triton_pid != old_triton
    assert "bert_launcher_tritonserver_restarts_total 1" in launcher.metrics()
    assert not [pid for pid in old_stubs if Path(f"/proc/{pid}").exists()], "the old tritonserver's stubs are gone"
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc") as client:
        assert client.embed(["after the restart"]).shape == (1, 384)
    assert launcher.process.poll() is None


def test_launcher_gives_up_on_a_crash_loop(settings, repository, tmp_path):
    crashy = tmp_path / "settings.toml"
    text, count = re.subn(r"^max_restarts = \d+", "max_restarts = 1", settings.path.read_text(), flags=re.M)
    assert count == 1
    crashy.write_text(text)
    launcher = Launcher(crashy, repository, Ports.free(), tmp_path / "launcher.log").start()
    try:
        os.kill(launcher.triton_pid, signal.SIGKILL)
        wait_ready(launcher)
        os.kill(launcher.triton_pid, signal.SIGKILL)
        assert launcher.process.wait(timeout=60) == 128 + signal.SIGKILL
    finally:
        launcher.kill()
    log = (tmp_path / "launcher.log").read_text()
    assert "died 2 times within 300 s (server.max_restarts = 1): giving up" in log


def test_a_second_server_on_the_same_ports_names_the_port_and_leaves_nothing(launcher, repository):
    stubs_before = set(stub_argvs())
    command = [sys.executable, "-m", "serving.launcher", "--repository", str(repository), "--host", "127.0.0.1"]
    for name in ("http", "grpc", "metrics"):
        command += [f"--{name}-port", str(getattr(launcher.ports, name))]
    command += ["--health-port", str(Ports.free().health)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert f"port {launcher.ports.http} on 127.0.0.1 (server.http_port) is in use" in run.stderr, run.stderr
    assert set(stub_argvs()) <= stubs_before, "the refused server started no stubs"
    assert launcher.ready()[0] == 200, "and the running one keeps serving"


def test_shared_memory_of_a_killed_tritonserver_is_removed(settings, repository, tmp_path):
    """A tritonserver killed outright cannot remove its stubs' 16 MiB regions in /dev/shm: the launcher does,
    and what this launcher ran leaves none behind."""
    before = shm_regions()
    launcher = Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log").start()
    try:
        first = shm_regions() - before
        assert first, "the running stub's region"
        os.kill(launcher.triton_pid, signal.SIGKILL)
        wait_ready(launcher)
        assert not first & shm_regions(), "the killed server's regions are gone once it was reaped"
        launcher.terminate()
        assert launcher.process.wait(timeout=60) == 0
    finally:
        launcher.kill()
    assert shm_regions() <= before, "every region of this launcher's stubs is gone"


def test_one_of_several_stubs_is_restored_and_the_launchers_children_die_with_it(settings, exported, tmp_path):
    """Two instances of the one-stage model: the watchdog reloads the stage when one stub dies, frees the dead
    stub's shared memory, and both serve again. A SIGKILLed launcher takes tritonserver and its other children
    with it (PR_SET_PDEATHSIG): nothing is left holding the ports, and the stubs end and free their own regions
    (stages/parent_watch.py)."""
    path = tmp_path / "settings.toml"
    model = settings.model
    path.write_text(
        f"[model]\nsource = {json.dumps(model.source)}\nname = {json.dumps(model.name)}\n\n[encoder]\ninstances = 2\n"
    )
    settings = load_settings(path)
    repository = generate(settings, exported, tmp_path / "model_repository")
    launcher = Launcher(path, repository, Ports.free(), tmp_path / "launcher.log").start()
    reloaded = []
    try:
        assert launcher.expected_stubs("ensemble") == 2
        first, _ = (stub for stub in stubs(launcher.triton_pid) if stub.model == "ensemble")
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while not (len(pids := launcher.stub_pids("ensemble")) == 2 and first.pid not in pids) or (
            launcher.ready()[0] != 200
        ):
            assert time.monotonic() < deadline, (pids, launcher.ready())
            time.sleep(0.1)
        assert launcher.ready()[1]["stub_restarts"][-1]["model"] == "ensemble"
        assert first.region not in shm_regions(), "the dead stub's region is freed at once, not at Triton's exit"
        reloaded = stubs(launcher.triton_pid)
        with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc") as client:
            assert client.embed(["two instances again"] * 8).shape == (8, 384)
        children = {pid: argv[0] for pid, _, argv in child_processes(launcher.process.pid)}
        assert launcher.triton_pid in children and len(children) >= 2, children  # tritonserver, the front
        launcher.process.kill()
        launcher.process.wait()
        deadline = time.monotonic() + 30
        while left := {pid: name for pid, name in children.items() if running(pid)}:
            assert time.monotonic() < deadline, f"outlived the launcher: {left}"
            time.sleep(0.1)
        while left := [stub for stub in reloaded if running(stub.pid) or stub.region in shm_regions()]:
            assert time.monotonic() < deadline, f"outlived their tritonserver: {left}"
            time.sleep(0.1)
    finally:
        launcher.kill()
        for stub in reloaded:  # only where the test failed: the stubs end themselves
            with contextlib.suppress(ProcessLookupError):
                os.kill(stub.pid, signal.SIGKILL)
