"""What /proc says about tritonserver's children: its Python-backend stubs (per model, with their shared-memory
region) and the CPU time a process has used. The watchdog, the drain, the orphan reaper, the reliability runs,
the benchmarks and the tests' leftover check read the stubs from here."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from common.process_state import running

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def child_processes(parent: int, proc: Path = Path("/proc")) -> list[tuple[int, str, list[bytes]]]:
    """(pid, state, argv) of the processes whose parent is `parent`.

    From the parent's own children lists (/proc/PID/task/TID/children) where the kernel has them: a scan of
    all of /proc took minutes from a process whose 64 client threads contended for the GIL."""
    lists = list((proc / str(parent) / "task").glob("*/children"))
    if lists:
        pids = set()
        for path in lists:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                pids.update(int(pid) for pid in path.read_text().split())
        paths = [proc / str(pid) / "stat" for pid in sorted(pids)]
    else:
        paths = proc.glob("[0-9]*/stat")
    found = []
    for stat in paths:
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent:
                found.append((int(stat.parent.name), state, (stat.parent / "cmdline").read_bytes().split(b"\0")))
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile
    return found


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    region: str  # its shared-memory region's name in /dev/shm

    @classmethod
    def of(cls, pid: int, argv: list[str]) -> Stub:
        """From a stub's command line: `triton_python_backend_stub <repository>/<model>/<version>/model.py
        <shm region> <default bytes> <growth bytes> <tritonserver pid> ...`."""
        return cls(pid, Path(argv[1]).parts[-3], argv[2])


def stubs(server_pid: int) -> list[Stub]:
    """Live (not zombie) Python-backend stub processes of tritonserver `server_pid`: Triton does not reap a stub
    that died, so it lingers as a zombie ('Z') child."""
    return [
        Stub.of(pid, [arg.decode(errors="replace") for arg in argv[:3]])
        for pid, state, argv in child_processes(server_pid)
        if state not in ("Z", "X") and len(argv) > 2 and argv[0].endswith(b"triton_python_backend_stub")
    ]


def stub_argvs(proc: Path = Path("/proc")) -> dict[int, list[str]]:
    """Every live Python-backend stub on this machine, whatever its parent: pid -> its command line."""
    found = {}
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        pid = int(cmdline.parent.name)
        if argv[0].endswith(b"triton_python_backend_stub") and running(pid, proc):
            found[pid] = [arg.decode(errors="replace") for arg in argv if arg]
    return found


def stub_processes(server_pid: int) -> dict[str, list[int]]:
    """Live stub pids of tritonserver `server_pid`, per model."""
    found: dict[str, list[int]] = {}
    for stub in stubs(server_pid):
        found.setdefault(stub.model, []).append(stub.pid)
    return found


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """utime + stime of one process in seconds; 0 when it is gone."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # fields 14 and 15 of stat(5)


def stubs_cpu_s(server_pid: int) -> float:
    """CPU seconds the live stubs of tritonserver `server_pid` have used: it grows while any model executes."""
    return sum(process_cpu_s(pid) for pids in stub_processes(server_pid).values() for pid in pids)
