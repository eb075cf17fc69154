import sys
import time

import numpy as np
import tritonclient.grpc as g

c = g.InferenceServerClient(sys.argv[1])
n = int(sys.argv[2])
x = g.InferInput("text", [1, 1], "BYTES")
x.set_data_from_numpy(np.array([[b"a short query about the weather in paris"]], dtype=object))
for _ in range(50):
    c.infer("ensemble", [x])
lat = []
for _ in range(n):
    t = time.perf_counter()
    c.infer("ensemble", [x])
    lat.append(time.perf_counter() - t)
lat.sort()
print(f"grpc p50 {lat[n // 2] * 1e3:.2f} ms p90 {lat[int(n * 0.9)] * 1e3:.2f}")
