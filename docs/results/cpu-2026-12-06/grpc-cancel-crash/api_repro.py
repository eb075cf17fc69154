"""/v1/embeddings with 1-6 ms budgets (X-Request-Timeout) through the real launcher's API front: does tritonserver
die (Signal 11, upstream issue 7368)? Run from the tree under test:

    python docs/results/cpu-2026-12-06/grpc-cancel-crash/api_repro.py SETTINGS SECONDS PROCESSES
"""

import asyncio
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def client(url: str, model: str, corpus: list[str], seconds: float, out) -> None:
    from bench.priority_bench import Driver

    async def run() -> None:
        statuses: Counter = Counter()
        end = time.monotonic() + seconds
        async with Driver(url, model, corpus) as driver:

            async def loop() -> None:
                while time.monotonic() < end:
                    budget = f"{random.uniform(1, 6):.2f}ms"
                    status, _ = await driver.post(1, {"X-Priority": "ingestion", "X-Request-Timeout": budget})
                    statuses[status] += 1

            await asyncio.gather(*(loop() for _ in range(32)))
        out.put(dict(statuses))

    asyncio.run(run())


def main() -> None:
    sys.path.insert(0, ".")
    from loadtest.corpus import load_text
    from model_repository.generate import generate
    from serving.launcher.harness import Launcher
    from serving.launcher.triton_command import Ports
    from settings import load_settings

    settings_path, seconds, processes = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    work = Path(tempfile.mkdtemp(prefix="segv-api-"))
    quiet = ["server.canary_interval_s=0"]
    settings = load_settings(settings_path, quiet)
    repository = generate(settings, settings.export_dir, work / "repository")
    ports = Ports.free()
    launcher = Launcher(settings_path, repository, ports, work / "launcher.log", quiet).start()
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
    args = (url, settings.model.name, load_text(), seconds, out)
    clients = [spawn.Process(target=client, args=args) for _ in range(processes)]
    for process in clients:
        process.start()
    totals: Counter = Counter()
    for _ in clients:
        totals.update(out.get(timeout=seconds + 120))
    launcher.terminate()
    launcher.process.wait(timeout=120)
    deaths = (work / "launcher.log").read_text().count("Signal (11)")
    print(dict(sorted(totals.items())), "Signal (11):", deaths, "log:", work / "launcher.log", flush=True)


if __name__ == "__main__":
    main()
