"""A stage's stub ends when its tritonserver ends, however that ends.

Triton forks each stub (`triton_python_backend_stub <model.py> <shm region> ...`) and stops it when it unloads
the model; a tritonserver that is SIGKILLed, or dies with a launcher that was, leaves its stubs running,
re-parented, each holding its memory (about 230 MB on the CPU, a CUDA context on a GPU) and its 16 MiB
shared-memory region. So every stage watches its parent from a thread: once the parent is no longer the
tritonserver that forked it (its pid is the stub's sixth argument), it removes its own region and exits at once
(nothing of a dead server's can still be answered). A server killed while the stub still imported its model.py
has already left it with another parent when the watch begins: it exits then."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

STUB = b"triton_python_backend_stub"
SHM = Path("/dev/shm")


def _stub_argv(cmdline: Path = Path("/proc/self/cmdline")) -> tuple[str, int] | None:
    """This process's shared-memory region and the pid of the tritonserver that forked it, when it is a Triton
    Python stub (`stub model.py region default_bytes growth_bytes parent_pid ...`), else None (a test importing a
    stage in its own process)."""
    try:
        argv = cmdline.read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) < 3 or not argv[0].endswith(STUB):
        return None
    parent = int(argv[5]) if len(argv) > 5 and argv[5].isdigit() else os.getppid()
    return argv[2].decode(errors="replace"), parent


def exit_with_parent(interval_s: float = 1.0) -> bool:
    """In a stub: end this process soon after its parent (tritonserver) has gone. Whether it watches."""
    stub = _stub_argv()
    if stub is None:
        return False
    region, parent = stub

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        (SHM / region).unlink(missing_ok=True)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    return True
