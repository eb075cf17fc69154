"""Unbudgeted one-text /v1 requests (closed loops) beside an open loop of short-budget requests: what the
short budgets cost the others. Run from a tree's root: python mixed.py SETTINGS OUT.json"""

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from loadtest.corpus import load_text
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_settings

settings_path, out = Path(sys.argv[1]), Path(sys.argv[2])
CLIENTS, RATE, BUDGET, SECONDS = 32, 100.0, "3ms", 15.0
settings = load_settings(settings_path, ["server.canary_interval_s=0"])
work = Path(tempfile.mkdtemp(prefix="mixed-"))
repository = generate(settings, settings.export_dir, work / "repository")
ports = Ports.free()
launcher = Launcher(settings_path, repository, ports, work / "launcher.log", ["server.canary_interval_s=0"])
texts = load_text()


async def drive(with_budgets: bool):
    url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
    model = settings.model.name
    plain, budgeted = [], []
    end = time.perf_counter() + SECONDS
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post(text, headers):
            started = time.perf_counter()
            async with session.post(
                url, json={"model": model, "input": text, "encoding_format": "base64"}, headers=headers
            ) as r:
                await r.read()
                return r.status, time.perf_counter() - started

        async def loop(i):
            k = i
            while time.perf_counter() < end:
                status, s = await post(texts[k % len(texts)], {})
                assert status == 200, status
                plain.append(s)
                k += CLIENTS

        async def side():
            tasks, k = [], 0
            while time.perf_counter() < end:
                tasks.append(asyncio.create_task(post(texts[k % len(texts)], {"X-Request-Timeout": BUDGET})))
                k += 1
                await asyncio.sleep(1 / RATE)
            budgeted.extend(await asyncio.gather(*tasks))

        await asyncio.gather(*(loop(i) for i in range(CLIENTS)), *([side()] if with_budgets else []))
    plain.sort()
    return {
        "plain_rps": round(len(plain) / SECONDS, 1),
        "plain_p50_ms": round(plain[len(plain) // 2] * 1e3, 2),
        "plain_p99_ms": round(plain[int(0.99 * (len(plain) - 1))] * 1e3, 2),
        "budgeted": {str(code): sum(1 for c, _ in budgeted if c == code) for code in {c for c, _ in budgeted}},
    }


try:
    launcher.start()
    result = {"alone": asyncio.run(drive(False)), "beside_budgets": asyncio.run(drive(True))}
finally:
    launcher.terminate()
    launcher.process.wait(timeout=120)
out.write_text(json.dumps(result, indent=1))
print(json.dumps(result))
