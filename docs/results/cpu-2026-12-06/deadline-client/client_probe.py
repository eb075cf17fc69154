"""The priority bench's deadline client alone: one-text posts in bursts from one aiohttp session, to a server that
answers 504 exactly 5 ms after each request arrives (its handler sleeps). The latencies above 5 ms are the client's
own and the loopback's.

    python docs/results/cpu-2026-12-06/deadline-client/client_probe.py PORT
"""

import asyncio
import multiprocessing
import sys
import time

import aiohttp
from aiohttp import web


async def handler(request):
    await request.read()
    await asyncio.sleep(0.005)
    return web.json_response({"error": "timeout"}, status=504)


async def bursts(port: int, burst: int) -> None:
    latencies = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post() -> float:
            body = {"model": "m", "input": ["a short query text"], "encoding_format": "base64"}
            started = time.perf_counter()
            async with session.post(f"http://127.0.0.1:{port}/v1/embeddings", json=body) as response:
                await response.read()
            return (time.perf_counter() - started) * 1000

        for _ in range(2):  # the connections open before the timed bursts
            await asyncio.gather(*(post() for _ in range(burst)))
        for _ in range(0, 1000, burst):
            latencies += await asyncio.gather(*(post() for _ in range(burst)))
    latencies.sort()
    within = sum(ms <= 15 for ms in latencies)
    print(f"burst {burst}: p50 {latencies[500]:.2f} p99 {latencies[990]:.2f} max {latencies[-1]:.2f} within15 {within}")


def serve(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/embeddings", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    port = int(sys.argv[1])
    server = multiprocessing.Process(target=serve, args=(port,), daemon=True)
    server.start()
    time.sleep(1.5)
    for burst in (64, 16, 1):
        asyncio.run(bursts(port, burst))
    server.terminate()
