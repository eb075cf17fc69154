"""Whether a process still runs, from /proc: for the launcher (serving/launcher/procfs.py), the API workers' counters
(serving/api/call_stats.py) and the stages' engine process (stages/engines/engine_process.py), which ends with its
tritonserver."""

from __future__ import annotations

from pathlib import Path


def running(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is a process that has not ended: a zombie, dead but not yet reaped by its parent, has."""
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
