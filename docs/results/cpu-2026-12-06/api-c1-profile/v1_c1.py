import asyncio
import sys
import time

import aiohttp

url = sys.argv[1]
n = int(sys.argv[2])
model = sys.argv[3]


async def main():
    async with aiohttp.ClientSession() as s:
        body = {"model": model, "input": ["a short query about the weather in paris"]}
        for _ in range(50):
            async with s.post(url, json=body) as r:
                await r.read()
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            async with s.post(url, json=body) as r:
                await r.read()
                assert r.status == 200, r.status
            lat.append(time.perf_counter() - t)
        lat.sort()
        print(f"p50 {lat[n // 2] * 1e3:.2f} ms p90 {lat[int(n * 0.9)] * 1e3:.2f}")


asyncio.run(main())
