"""A stub whose tritonserver died before the stub's model.py had run (parent_watch.py) ends at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from model_repository.stages.parent_watch import SHM
from settings import ROOT

WATCHING = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[-1])
    from model_repository.stages.parent_watch import exit_with_parent
    print(exit_with_parent(interval_s=0.05), flush=True)
    time.sleep(30)
    """
)


def start_stub(tmp_path: Path, region: str, parent_pid: int) -> subprocess.Popen:
    """A Python process laid out as Triton starts a stub: argv[0] the stub's path, then model.py, the region,
    two sizes and the pid of the tritonserver that forked it."""
    script = tmp_path / "model.py"
    script.write_text(WATCHING)
    argv = [str(tmp_path / "triton_python_backend_stub"), str(script), region, "16777216", "1048576", str(parent_pid),
            str(ROOT)]  # fmt: skip
    return subprocess.Popen(argv, executable=sys.executable, stdout=subprocess.PIPE, text=True)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_a_stub_that_lost_its_tritonserver_before_watching_exits_and_frees_its_region(tmp_path):
    region = f"parent_watch_test_{uuid.uuid4().hex}"
    (SHM / region).write_bytes(b"\0")
    gone = os.getpid() + 4_000_000  # not this stub's parent: the server that forked it is already gone
    stub = start_stub(tmp_path, region, gone)
    try:
        assert stub.wait(timeout=10) == 0  # the watch's exit, before the script's own print at times
        assert not (SHM / region).exists()
    finally:
        stub.kill()
        stub.wait()
        (SHM / region).unlink(missing_ok=True)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_a_stub_whose_tritonserver_lives_keeps_running(tmp_path):
    region = f"parent_watch_test_{uuid.uuid4().hex}"
    (SHM / region).write_bytes(b"\0")
    stub = start_stub(tmp_path, region, os.getpid())
    try:
        assert stub.stdout.readline().strip() == "True", "the stub watches"
        with pytest.raises(subprocess.TimeoutExpired):
            stub.wait(timeout=0.5)
        assert (SHM / region).exists()
    finally:
        stub.kill()
        stub.wait()
        (SHM / region).unlink(missing_ok=True)
