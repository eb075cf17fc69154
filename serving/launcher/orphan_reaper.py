"""python -m serving.launcher.orphan_reaper LAUNCHER_PID REPOSITORY: the stubs a killed launcher leaves, ended.

A SIGKILLed launcher takes tritonserver with it (PR_SET_PDEATHSIG), not tritonserver's Python stubs. Each stub ends
itself once its tritonserver is gone (stages/parent_watch.py), from a Python thread. A stub that was handing an
answer to tritonserver at that moment waits for it for ever in the backend's C++ while holding the GIL (Triton
2.51): that thread never runs, nor the backend's own exit, and the stub keeps its memory (a CUDA context on a GPU)
and its 16 MiB region. The launcher starts this process in a session of its own. It waits for the launcher to end,
gives the stubs of REPOSITORY whose tritonserver is gone GRACE_S to end themselves, then SIGKILLs the rest and
removes their regions.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from serving.launcher.procfs import Stub, running, stub_argvs
from serving.launcher.shm import remove_regions

POLL_S = 1.0
GRACE_S = 5.0


def orphaned_stubs(repository: Path) -> list[Stub]:
    """Running stubs of models under `repository` whose tritonserver (the pid in their command line) has ended."""
    found = []
    for pid, argv in stub_argvs().items():
        if len(argv) < 6 or not argv[5].isdigit():  # argv[5]: its tritonserver's pid (Stub.of)
            continue
        if Path(argv[1]).resolve().is_relative_to(repository) and not running(int(argv[5])):
            found.append(Stub.of(pid, argv))
    return found


def main(argv: list[str]) -> None:
    launcher, repository = int(argv[0]), Path(argv[1]).resolve()
    while os.getppid() == launcher:
        time.sleep(POLL_S)
    deadline = time.monotonic() + GRACE_S
    while (left := orphaned_stubs(repository)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for stub in left:
        try:
            os.kill(stub.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        remove_regions({stub.region})
        print(f"orphan_reaper: ended stub {stub.pid} of {stub.model}, whose tritonserver had gone", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
