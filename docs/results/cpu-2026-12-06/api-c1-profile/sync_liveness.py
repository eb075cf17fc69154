import sys
import time

import grpc

port, n = sys.argv[1], int(sys.argv[2])
ch = grpc.insecure_channel(f"127.0.0.1:{port}")
call = ch.unary_unary("/inference.GRPCInferenceService/ServerLive", request_serializer=None, response_deserializer=None)
for _ in range(200):
    call(b"", timeout=10)
lat = []
c0 = time.process_time()
w0 = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    call(b"", timeout=10)
    lat.append(time.perf_counter() - t)
w = time.perf_counter() - w0
c = time.process_time() - c0
lat.sort()
print(f"sync c=1 calls/s {n / w:.0f} p50 {lat[n // 2] * 1e3:.3f} ms cpu/call {c / n * 1e6:.0f} us")
