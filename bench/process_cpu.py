"""CPU seconds per process kind, read from /proc: tritonserver, each model's stubs, the engine processes the stubs
share (engines/engine_process.py), and named others.

A snapshot sums utime + stime of every live process of a kind (stubs grouped by the model they serve, the
way the launcher's watchdog finds them); the difference of two snapshots over the requests served in
between is the CPU each kind spends per request. Processes that ended between snapshots drop out, so
compare snapshots of one steady run.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from common.contract import engine_process_files
from model_repository.stages.engines.shared import process_stats
from serving.launcher.procfs import TICKS_PER_S, process_cpu_s, stub_processes


def host_busy_s(proc: Path = Path("/proc")) -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    values = [int(v) for v in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS_PER_S


def find_processes(comm: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids whose command name (/proc/PID/comm) is `comm`."""
    pids = []
    for path in proc.glob("[0-9]*/comm"):
        try:
            if path.read_text().strip() == comm:
                pids.append(int(path.parent.name))
        except (OSError, ValueError):
            continue
    return pids


def engine_process_stats(server_pid: int) -> dict[str, dict]:
    """Each engine process of tritonserver `server_pid` (by its socket, named after the server as the launcher's
    clean-up finds its files): its counters so far and its pid (engine_process.Stats)."""
    found = {}
    for path in engine_process_files(server_pid, ".sock"):
        with contextlib.suppress(OSError):  # ended meanwhile
            found[path.stem] = process_stats(path)
    return found


def engine_batching(before: dict[str, dict], after: dict[str, dict], wall_s: float) -> dict:
    """How the stubs' calls batched in the engine processes between two engine_process_stats snapshots taken
    wall_s apart: batches/s, calls and sequences a batch, the share of batches that were queries', and the share of
    the time the process waited for the device's results."""
    spent = {name: sum(stats[name] - before.get(key, {}).get(name, 0) for key, stats in after.items())
             for name in ("batches", "query_batches", "calls", "sequences", "waited_s")}  # fmt: skip
    batches = max(spent["batches"], 1)
    return {
        "batches_per_s": round(spent["batches"] / wall_s, 1),
        "calls_per_batch": round(spent["calls"] / batches, 2),
        "sequences_per_batch": round(spent["sequences"] / batches, 1),
        "query_batch_share": round(spent["query_batches"] / batches, 3),
        "waited_share": round(spent["waited_s"] / wall_s, 3),
    }


def snapshot(server_pid: int, others: dict[str, list[int]] | None = None) -> dict:
    """CPU seconds so far per kind: "tritonserver", "<model> stubs", "engine process" (where the stubs share one;
    its counters under "engine stats"), each of `others`, and "host" (all cores), with the wall time under "wall"."""
    cpu: dict = {"tritonserver": process_cpu_s(server_pid)}
    for model, pids in sorted(stub_processes(server_pid).items()):
        cpu[f"{model} stubs"] = sum(map(process_cpu_s, pids))
    engines = engine_process_stats(server_pid)
    if engines:
        cpu["engine process"] = sum(process_cpu_s(stats["pid"]) for stats in engines.values())
        cpu["engine stats"] = engines
    for kind, pids in (others or {}).items():
        cpu[kind] = sum(map(process_cpu_s, pids))
    cpu["host"] = host_busy_s()
    cpu["wall"] = time.monotonic()
    return cpu


def thread_cpu_s(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, float]]:
    """{thread id: (its name, utime + stime in seconds)} of every live thread of `pid`."""
    threads = {}
    for task in (proc / str(pid) / "task").glob("[0-9]*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        threads[int(task.name)] = (name, process_cpu_s(int(task.name), task.parent))
    return threads


def busiest_threads(before: dict, after: dict, wall_s: float, top: int = 5) -> list[dict]:
    """The `top` threads by cores busy between two thread_cpu_s snapshots taken `wall_s` apart: whether one
    thread (one core) is what caps a process that is not busy as a whole."""
    busy = [
        {"tid": tid, "name": name, "cores_busy": round((cpu - before.get(tid, (name, 0.0))[1]) / wall_s, 2)}
        for tid, (name, cpu) in after.items()
    ]
    return sorted(busy, key=lambda thread: -thread["cores_busy"])[:top]


def per_request(before: dict, after: dict, requests: int) -> dict:
    """Cores busy and CPU microseconds per request of each kind between two snapshots (and, where the stubs share
    an engine process, how their calls batched there: "engine_batching")."""
    wall = after["wall"] - before["wall"]
    kinds = [kind for kind in after if kind not in ("wall", "engine stats")]
    spent = {kind: after[kind] - before.get(kind, 0.0) for kind in kinds}
    figures = {
        "window_s": round(wall, 2),
        "cores_busy": {kind: round(seconds / wall, 2) for kind, seconds in spent.items()} if wall > 0 else {},
        "cpu_us_per_request": {kind: round(seconds / requests * 1e6, 1) for kind, seconds in spent.items()}
        if requests > 0
        else {},
    }
    if after.get("engine stats") and wall > 0:
        figures["engine_batching"] = engine_batching(before.get("engine stats", {}), after["engine stats"], wall)
    return figures
