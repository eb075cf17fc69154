import asyncio
import os
import sys
import time

import grpc

port, n, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


async def main():
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = ch.unary_unary(
        "/inference.GRPCInferenceService/ServerLive", request_serializer=None, response_deserializer=None
    )
    for _ in range(200):
        await call(b"", timeout=10)
    lat = []

    async def worker(k):
        for _ in range(k):
            t = time.perf_counter()
            await call(b"", timeout=10)
            lat.append(time.perf_counter() - t)

    c0 = time.process_time()
    w0 = time.perf_counter()
    await asyncio.gather(*(worker(n // conc) for _ in range(conc)))
    w = time.perf_counter() - w0
    c = time.process_time() - c0
    lat.sort()
    p50_ms, cpu_us = lat[len(lat) // 2] * 1e3, c / len(lat) * 1e6
    print(
        f"{os.environ.get('TAG', '')} c={conc} calls/s {len(lat) / w:.0f} p50 {p50_ms:.3f} ms cpu/call {cpu_us:.0f} us"
    )
    await ch.close()


asyncio.run(main())
