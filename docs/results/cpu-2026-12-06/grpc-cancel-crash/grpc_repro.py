"""Direct gRPC calls with 1-6 ms deadlines to tritonserver 2.51, served by the real launcher: does tritonserver die
(Signal 11, upstream issue 7368)? With a fourth argument each call also carries deadline_ns, so the stage refuses
it at once. Run from the tree under test:

    python docs/results/cpu-2026-12-06/grpc-cancel-crash/grpc_repro.py SETTINGS SECONDS PROCESSES [deadline_ns]
"""

import asyncio
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path


def client(port: int, seconds: float, with_deadline: bool, out) -> None:
    import grpc

    from common.contract import DEADLINE_PARAMETER
    from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, tensors_infer_message

    async def run() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_CHANNEL_ARGS)
        call = channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)
        counts = {"ok": 0, "deadline": 0, "other": 0}
        end = time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < end:
                budget = random.uniform(0.001, 0.006)
                parameters = {DEADLINE_PARAMETER: time.monotonic_ns() + int(budget * 1e9)} if with_deadline else None
                text = {"text": [b"a short query about deadlines"]}
                message = tensors_infer_message("ensemble", text, ["embedding"], "", parameters).SerializeToString()
                try:
                    await call(message, timeout=budget)
                    counts["ok"] += 1
                except grpc.aio.AioRpcError as exc:
                    counts["deadline" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "other"] += 1

        await asyncio.gather(*(loop() for _ in range(32)))
        out.put(counts)

    asyncio.run(run())


def main() -> None:
    sys.path.insert(0, ".")
    from model_repository.generate import generate
    from serving.launcher.harness import Launcher
    from serving.launcher.triton_command import Ports
    from settings import load_settings

    settings_path, seconds, processes = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    with_deadline = len(sys.argv) > 4
    work = Path(tempfile.mkdtemp(prefix="segv-"))
    quiet = ["server.canary_interval_s=0"]
    settings = load_settings(settings_path, quiet)
    repository = generate(settings, settings.export_dir, work / "repository")
    ports = Ports.free()
    launcher = Launcher(settings_path, repository, ports, work / "launcher.log", quiet).start()
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    args = (ports.triton_grpc or ports.grpc, seconds, with_deadline, out)
    clients = [spawn.Process(target=client, args=args) for _ in range(processes)]
    for process in clients:
        process.start()
    totals: dict[str, int] = {}
    for _ in clients:
        for key, value in out.get(timeout=seconds + 120).items():
            totals[key] = totals.get(key, 0) + value
    launcher.terminate()
    launcher.process.wait(timeout=120)
    deaths = (work / "launcher.log").read_text().count("Signal (11)")
    print(totals, "Signal (11):", deaths, "log:", work / "launcher.log")


if __name__ == "__main__":
    main()
