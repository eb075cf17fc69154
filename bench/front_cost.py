"""python -m bench.front_cost: what the HTTP front (serving/http_front/proxy.py) costs per request.

Starts the real launcher (front + tritonserver) on free ports and sends the same HTTP requests, in rounds
that alternate between the front (server.http_port) and tritonserver's own HTTP behind it
(front.triton_http_port), so both see the same machine state: the ensemble with one corpus text, and
GET /v2/health/ready (nothing but the hop). Per route and concurrency it records requests/s, p50 and p99
latency, and the front workers' CPU microseconds per request (/proc). Writes front_cost.json into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from bench.record import header, write
from common.contract import TEXT_INPUT
from loadtest.corpus import load_text
from serving.launcher.harness import Launcher
from serving.launcher.procfs import child_processes, process_cpu_s
from serving.launcher.triton_command import Ports
from settings import load_settings

Call = Callable[[], Awaitable[None]]


def aiohttp_calls(url: str, body: bytes | None) -> tuple[Call, Call]:
    """One request to `url` (POST of a JSON body, or GET without one) that fails on any status but 200, and
    what closes its keep-alive session; made inside the event loop that sends it."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    headers = {"Content-Type": "application/json"}

    async def once() -> None:
        method = session.post(url, data=body, headers=headers) if body else session.get(url)
        async with method as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}")

    return once, session.close


async def timed_calls(once: Call, concurrency: int, duration_s: float) -> list[float]:
    """Latencies (s) of `concurrency` clients each making its next call when the last one is answered."""
    latencies: list[float] = []
    deadline = time.perf_counter() + duration_s

    async def client() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await once()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


async def closed_loop(url: str, body: bytes | None, concurrency: int, duration_s: float) -> list[float]:
    """timed_calls of requests to `url` on a session of their own."""
    once, close = aiohttp_calls(url, body)
    try:
        return await timed_calls(once, concurrency, duration_s)
    finally:
        await close()


def summary(latencies: list[float], seconds: float, front_cpu_s: float | None) -> dict:
    ordered = sorted(latencies)
    result = {
        "requests": len(ordered),
        "rps": round(len(ordered) / seconds, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 3),
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3),
    }
    if front_cpu_s is not None:
        result["front_cpu_us_per_request"] = round(1e6 * front_cpu_s / len(ordered), 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.front_cost", description=__doc__)
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--duration-s", type=float, default=5.0, help="per route, shape and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    settings = load_settings(args.settings)
    body = json.dumps(
        {"inputs": [{"name": TEXT_INPUT, "shape": [1, 1], "datatype": "BYTES", "data": [load_text()[0]]}]}
    ).encode()
    args.out.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    launcher = Launcher(settings.path, settings.repository_dir, ports, args.out / "front_cost_launcher.log").start()
    routes = {"front": ports.http, "tritonserver": ports.triton_http}
    requests = {"ensemble": ("/v2/models/ensemble/infer", body), "health": ("/v2/health/ready", None)}
    results: dict = {}
    try:
        children = child_processes(launcher.process.pid)
        front_pids = [pid for pid, _, argv in children if b"serving.http_front" in argv]
        for request, (path, payload) in requests.items():
            for concurrency in args.concurrency:
                asyncio.run(closed_loop(f"http://127.0.0.1:{ports.http}{path}", payload, concurrency, 1.0))  # warm-up
                runs: dict[str, list[dict]] = {route: [] for route in routes}
                for _ in range(args.rounds):
                    for route, port in routes.items():
                        cpu_before = sum(process_cpu_s(pid) for pid in front_pids)
                        started = time.perf_counter()
                        url = f"http://127.0.0.1:{port}{path}"
                        latencies = asyncio.run(closed_loop(url, payload, concurrency, args.duration_s))
                        seconds = time.perf_counter() - started
                        front_cpu = sum(process_cpu_s(pid) for pid in front_pids) - cpu_before
                        runs[route].append(summary(latencies, seconds, front_cpu if route == "front" else None))
                results[f"{request} c={concurrency}"] = runs
                print(request, concurrency, {r: [x["rps"] for x in v] for r, v in runs.items()}, flush=True)
    finally:
        launcher.terminate()
        launcher.process.wait(timeout=60)
    record = {
        **header("front_cost", argv),
        "settings": str(settings.path),
        "front_workers": settings.front.workers,
        "note": "client, front and tritonserver share the machine; rounds alternate front and tritonserver",
        "results": results,
    }
    write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
