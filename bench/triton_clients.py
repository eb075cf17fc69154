"""python -m bench.triton_clients: what each way of calling tritonserver from an asyncio process costs per call.

The API front's hop to Triton (serving/api/triton_link.py) could be any of three clients on PyPI: grpc.aio
(what it uses), the synchronous gRPC stub's futures handed back to the event loop, or aiohttp to Triton's
HTTP port. Starts the real launcher on free ports and, from this one process, sends in closed loops of
`--concurrency` clients either the ensemble with one corpus text (gRPC: the KServe ModelInfer protobuf; HTTP:
its JSON body) or the liveness check alone (ServerLive, GET /v2/health/live: nothing but the hop). Rounds
alternate the clients so that all see the same machine state. Per client: calls/s, p50 and p99 latency and
this process's CPU microseconds per call (every thread: gRPC's own included) and tritonserver's (its
stubs apart). Writes triton_clients.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from bench.front_cost import Call, aiohttp_calls, summary, timed_calls
from bench.record import header, write
from common.contract import TEXT_INPUT
from loadtest.corpus import load_text
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, model_infer_request
from serving.launcher.harness import Launcher
from serving.launcher.procfs import process_cpu_s
from serving.launcher.triton_command import Ports
from settings import load_settings

CLIENTS = ("grpc.aio", "grpc-futures", "aiohttp")
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"


def grpc_aio(target: str, method: str, body: bytes) -> tuple[Call, Call]:
    channel = grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_ARGS)
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)

    async def once() -> None:
        await call(body, timeout=60)

    return once, channel.close


def grpc_futures(target: str, method: str, body: bytes) -> tuple[Call, Call]:
    """The synchronous stub's future, its answer handed to the loop from gRPC's thread."""
    channel = grpc.insecure_channel(target, options=GRPC_CHANNEL_ARGS)
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)

    async def once() -> None:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()

        def done(future: grpc.Future) -> None:
            loop.call_soon_threadsafe(_settle, answer, future)

        call.future(body, timeout=60).add_done_callback(done)
        await answer

    async def close() -> None:
        channel.close()

    return once, close


def _settle(answer: asyncio.Future, future: grpc.Future) -> None:
    error = future.exception()
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(None)


async def closed_loop(make: Callable[[], tuple[Call, Call]], concurrency: int, seconds: float, server_pid: int) -> dict:
    once, close = make()
    try:
        for _ in range(50):  # connect and warm
            await once()
        cpu, server, started = time.process_time(), process_cpu_s(server_pid), time.perf_counter()
        latencies = await timed_calls(once, concurrency, seconds)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        server = process_cpu_s(server_pid) - server
    finally:
        await close()
    result = summary(latencies, wall, None)
    result["client_cpu_us_per_call"] = round(1e6 * cpu / len(latencies), 1)
    result["tritonserver_cpu_us_per_call"] = round(1e6 * server / len(latencies), 1)  # its stubs not included
    return result


def makers(ports: Ports, text: str) -> dict[str, dict[str, Callable]]:
    """For each request ("ensemble", "live"), each client's constructor."""
    target, http = f"127.0.0.1:{ports.grpc}", f"http://127.0.0.1:{ports.triton_http}"
    infer = model_infer_request("ensemble", [text])
    body = json.dumps({"inputs": [{"name": TEXT_INPUT, "shape": [1, 1], "datatype": "BYTES", "data": [text]}]})
    return {
        "ensemble": {
            "grpc.aio": lambda: grpc_aio(target, MODEL_INFER, infer),
            "grpc-futures": lambda: grpc_futures(target, MODEL_INFER, infer),
            "aiohttp": lambda: aiohttp_calls(f"{http}/v2/models/ensemble/infer", body.encode()),
        },
        "live": {
            "grpc.aio": lambda: grpc_aio(target, SERVER_LIVE, b""),
            "grpc-futures": lambda: grpc_futures(target, SERVER_LIVE, b""),
            "aiohttp": lambda: aiohttp_calls(f"{http}/v2/health/live", None),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.triton_clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--requests", nargs="+", choices=("ensemble", "live"), default=["live", "ensemble"])
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--duration-s", type=float, default=4.0, help="per request, client, concurrency and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    settings = load_settings(args.settings)
    args.out.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    launcher = Launcher(settings.path, settings.repository_dir, ports, args.out / "triton_clients_launcher.log").start()
    results: dict = {}
    try:
        ways = makers(ports, load_text()[0])
        for request in args.requests:
            for concurrency in args.concurrency:
                runs: dict[str, list[dict]] = {client: [] for client in args.clients}
                for _ in range(args.rounds):
                    for client in args.clients:
                        measured = closed_loop(ways[request][client], concurrency, args.duration_s, launcher.triton_pid)
                        runs[client].append(asyncio.run(measured))
                results[f"{request} c={concurrency}"] = runs
                keys = ("p50_ms", "client_cpu_us_per_call", "tritonserver_cpu_us_per_call")
                figures = {name: [tuple(r[key] for key in keys) for r in rs] for name, rs in runs.items()}
                print(request, f"c={concurrency}", "(p50 ms, client, tritonserver us/call):", figures, flush=True)
    finally:
        launcher.terminate()
        launcher.process.wait(timeout=60)
    record = {
        **header("triton_clients", argv),
        "settings": str(settings.path),
        "note": "client and server share the machine; rounds alternate the clients; CPU is this process's, all threads",
        "results": results,
    }
    write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
