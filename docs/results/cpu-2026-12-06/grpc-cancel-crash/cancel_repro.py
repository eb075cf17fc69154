"""Calls with 1-6 ms budgets through the real launcher: does tritonserver 2.51 die (Signal 11, upstream issue 7368)?
Run from the tree under test:

    python docs/results/cpu-2026-12-06/grpc-cancel-crash/cancel_repro.py SETTINGS SECONDS PROCESSES ROUTE

ROUTE: `api`, /v1/embeddings with X-Request-Timeout (one text, X-Priority: ingestion); `grpc`, tritonserver's own
gRPC with that gRPC deadline; `grpc-deadline_ns`, the same, each call also carrying deadline_ns (the stage refuses
it at once). Each process keeps 32 requests in flight.
"""

import asyncio
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

IN_FLIGHT = 32


async def api_loop(url: str, model: str, corpus: list[str], end: float, counts: Counter) -> None:
    from bench.priority_bench import Driver

    async with Driver(url, model, corpus) as driver:

        async def loop() -> None:
            while time.monotonic() < end:
                budget = f"{random.uniform(1, 6):.2f}ms"
                status, _ = await driver.post(1, {"X-Priority": "ingestion", "X-Request-Timeout": budget})
                counts[status] += 1

        await asyncio.gather(*(loop() for _ in range(IN_FLIGHT)))


async def grpc_loop(port: int, with_deadline: bool, end: float, counts: Counter) -> None:
    import grpc

    from common.contract import DEADLINE_PARAMETER
    from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, tensors_infer_message

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_CHANNEL_ARGS)
    call = channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)

    async def loop() -> None:
        while time.monotonic() < end:
            budget = random.uniform(0.001, 0.006)
            parameters = {DEADLINE_PARAMETER: time.monotonic_ns() + int(budget * 1e9)} if with_deadline else None
            text = {"text": [b"a short query about deadlines"]}
            message = tensors_infer_message("ensemble", text, ["embedding"], "", parameters).SerializeToString()
            try:
                await call(message, timeout=budget)
                counts["answered"] += 1
            except grpc.aio.AioRpcError as exc:
                counts["deadline" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "refused"] += 1

    await asyncio.gather(*(loop() for _ in range(IN_FLIGHT)))


def client(route: str, target: tuple, seconds: float, out) -> None:
    counts: Counter = Counter()
    end = time.monotonic() + seconds
    if route == "api":
        asyncio.run(api_loop(*target, end, counts))
    else:
        asyncio.run(grpc_loop(target[0], route == "grpc-deadline_ns", end, counts))
    out.put(dict(counts))


def main() -> None:
    sys.path.insert(0, ".")
    from loadtest.corpus import load_text
    from model_repository.generate import generate
    from serving.launcher.harness import Launcher
    from serving.launcher.triton_command import Ports
    from settings import load_settings

    settings_path, seconds, processes, route = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    work = Path(tempfile.mkdtemp(prefix="cancel-"))
    quiet = ["server.canary_interval_s=0"]
    settings = load_settings(settings_path, quiet)
    repository = generate(settings, settings.export_dir, work / "repository")
    ports = Ports.free()
    launcher = Launcher(settings_path, repository, ports, work / "launcher.log", quiet).start()
    url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
    target = (url, settings.model.name, load_text()) if route == "api" else (ports.triton_grpc or ports.grpc,)
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    clients = [spawn.Process(target=client, args=(route, target, seconds, out)) for _ in range(processes)]
    for process in clients:
        process.start()
    totals: Counter = Counter()
    for _ in clients:
        totals.update(out.get(timeout=seconds + 120))
    launcher.terminate()
    launcher.process.wait(timeout=120)
    deaths = (work / "launcher.log").read_text().count("Signal (11)")
    print(dict(sorted(totals.items(), key=str)), "Signal (11):", deaths, "log:", work / "launcher.log", flush=True)


if __name__ == "__main__":
    main()
