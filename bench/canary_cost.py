"""python -m bench.canary_cost: what the launcher's liveness canary (serving/launcher/canary.py) costs.

Starts the real launcher once per canary interval given (0 = off), each on its own: idle for --seconds, the CPU
seconds of its whole process tree (launcher, tritonserver, stubs, fronts) are read from /proc; then under a
closed-loop gRPC load (--users threads, one text per request) for --seconds, the throughput. A short interval
(0.1 s by default) sends enough canaries for their CPU to stand out of the idle noise: its idle CPU over the
canary-off server's, divided by the canaries sent, is the CPU one canary costs. Writes canary_cost.json to --out.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from bench.record import header, write
from client.core import TextClient
from loadtest.corpus import load_text
from serving.launcher.harness import Launcher
from serving.launcher.procfs import child_processes, process_cpu_s
from serving.launcher.triton_command import Ports
from settings import load_deployment


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (utime + stime) of pid and every live descendant."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        total += process_cpu_s(current)
        pending += [child for child, _, _ in child_processes(current)]
    return total


def throughput(grpc_url: str, users: int, seconds: float) -> float:
    """Requests per second of `users` closed-loop threads, one corpus text per request."""
    texts, done, stop = load_text(), [0] * users, threading.Event()

    def user(index: int) -> None:
        with TextClient(grpc_url, "grpc", timeout_s=30) as client:
            while not stop.is_set():
                client.embed([texts[(index * 7919 + done[index]) % len(texts)]])
                done[index] += 1

    threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
    for thread in threads:
        thread.start()
    time.sleep(2)  # warm-up: connections, first batches
    first, started = sum(done), time.monotonic()
    time.sleep(seconds)
    rate = (sum(done) - first) / (time.monotonic() - started)
    stop.set()
    for thread in threads:
        thread.join()
    return rate


def measure(settings: list[Path], repository: Path, interval_s: float, args, log: Path) -> dict:
    overrides = [f"server.canary_interval_s={interval_s}"]
    launcher = Launcher(settings, repository, Ports.free(), log, overrides).start()
    try:
        time.sleep(2)
        before, started = tree_cpu_s(launcher.process.pid), time.monotonic()
        time.sleep(args.seconds)
        idle_cpu_s = tree_cpu_s(launcher.process.pid) - before
        idle_wall_s = time.monotonic() - started
        rate = throughput(f"127.0.0.1:{launcher.ports.grpc}", args.users, args.seconds)
    finally:
        launcher.terminate()
        launcher.process.wait(timeout=120)
    return {
        "canary_interval_s": interval_s,
        "idle_cpu_s": round(idle_cpu_s, 3),
        "idle_wall_s": round(idle_wall_s, 2),
        "idle_canaries": int(idle_wall_s / interval_s) if interval_s else 0,
        "load_requests_per_s": round(rate, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.canary_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", type=Path, nargs="+", default=[Path("settings/defaults.toml")])
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.0, 5.0, 0.0, 5.0, 0.1])
    parser.add_argument("--seconds", type=float, default=15.0, help="idle, then under load, per interval")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("build/canary_cost"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    repository = load_deployment(args.settings).repository_dir
    runs = [measure(args.settings, repository, i, args, args.out / "launcher.log") for i in args.intervals]
    off = [run for run in runs if run["canary_interval_s"] == 0]
    idle_off = sum(run["idle_cpu_s"] / run["idle_wall_s"] for run in off) / len(off)  # CPU s per s, canary off
    fast = [run for run in runs if 0 < run["canary_interval_s"] < 1]
    per_canary = [
        (run["idle_cpu_s"] - idle_off * run["idle_wall_s"]) / run["idle_canaries"]
        for run in fast
        if run["idle_canaries"]
    ]
    record = header("canary_cost", argv) | {"users": args.users, "seconds": args.seconds, "runs": runs}
    if per_canary:
        cpu_ms = 1e3 * sum(per_canary) / len(per_canary)
        record["cpu_ms_per_canary"] = round(cpu_ms, 2)
        record["share_of_one_core_at_5_s"] = f"{cpu_ms / 5e3:.4%}"
    write(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
