"""No process outlives its server: a tritonserver that is SIGKILLed (nobody left to reap its children, as when
the launcher itself is killed) takes its Python stubs and their shared-memory regions with it
(model_repository/stages/parent_watch.py), and a SIGKILLed launcher takes even a stub that cannot run its own
watch (serving/launcher/orphan_reaper.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from model_repository.generate import generate
from serving.launcher.harness import Launcher, local_server
from serving.launcher.procfs import running, stubs
from serving.launcher.triton_command import Ports


@pytest.mark.parametrize("topology", ["one_stage", "two_stage"])
def test_a_killed_tritonservers_stubs_end_and_free_their_shared_memory(settings, exported, tmp_path, topology):
    chosen = dataclasses.replace(settings, ensemble=dataclasses.replace(settings.ensemble, topology=topology))
    repository = generate(chosen, exported, tmp_path / "repository")
    server = local_server(chosen, repository, tmp_path / "server")
    server.start()
    try:
        found = stubs(server.process.pid)
        one_stage = {"ensemble", "ensemble-query"}  # the model and its query lane
        assert {stub.model for stub in found} == (one_stage if topology == "one_stage" else {"tokenizer", "encoder"})
        assert all((Path("/dev/shm") / stub.region).exists() for stub in found)
        # Not reaped until the end: a dead parent nobody reaps (init in many containers does not) is a zombie,
        # which the stub's own liveness check (kill(parent, 0)) still takes for alive.
        os.kill(server.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(running(stub.pid) for stub in found):
            time.sleep(0.1)
        left = [stub for stub in found if running(stub.pid)]
        assert not left, f"stubs outlived their tritonserver: {left}"
        assert not [stub.region for stub in found if (Path("/dev/shm") / stub.region).exists()]
    finally:
        server.stop()
        server.reap()


def test_a_killed_launcher_takes_a_stub_that_cannot_end_itself(settings, repository, tmp_path):
    """A stopped stub stands for one blocked in the backend's C++ holding the GIL, as when tritonserver dies while
    the stub hands it an answer (Triton 2.51): its own watch cannot run. It and its region go all the same."""
    launcher = Launcher(settings.path, repository, Ports.free(), tmp_path / "launcher.log").start()
    (stuck, *_) = stubs(launcher.triton_pid)
    try:
        os.kill(stuck.pid, signal.SIGSTOP)
        launcher.kill()
        deadline = time.monotonic() + 30
        while running(stuck.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(stuck.pid), "the stopped stub outlived its killed launcher"
        assert not (Path("/dev/shm") / stuck.region).exists()
        assert f"ended stub {stuck.pid} of {stuck.model}" in (tmp_path / "launcher.log").read_text()
    finally:
        if running(stuck.pid):
            os.kill(stuck.pid, signal.SIGKILL)
            (Path("/dev/shm") / stuck.region).unlink(missing_ok=True)
