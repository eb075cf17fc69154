"""nonzero_rows (one copy of counts, columns and values) against its form before aea1925 (values, then a row and a
column an entry), on the CPU, where no device copy is made: same rows, and what each costs a call.

    taskset -c 0,1 python docs/results/cpu-2026-12-06/sparse-copies/nonzero_rows_bench.py
"""

import time

import numpy as np
import torch

from model_repository.stages.engines.sparse import SparseRow
from model_repository.stages.engines.torch_sparse import nonzero_rows


def old(pooled):  # nonzero_rows before aea1925
    entries = pooled.nonzero()
    values = pooled[entries[:, 0], entries[:, 1]].cpu().numpy()
    rows, cols = entries.to(torch.int32).cpu().numpy().T
    counts = np.bincount(rows, minlength=pooled.shape[0])
    ends = np.cumsum(counts)
    starts = ends - counts
    cols, values = cols.astype(np.int32, copy=False), values.astype(np.float32, copy=False)
    return [SparseRow(cols[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)]


torch.manual_seed(0)
torch.set_num_threads(2)
for n in (1, 64, 256):
    x = torch.rand(n, 30522)
    x[x < 0.99] = 0
    a, b = old(x), nonzero_rows(x)
    assert all((r.indices == s.indices).all() and (r.values == s.values).all() for r, s in zip(a, b, strict=True))
    for f in (old, nonzero_rows, old, nonzero_rows):
        t = time.perf_counter()
        [f(x) for _ in range(20)]
        print(n, f.__name__, f"{(time.perf_counter() - t) / 20 * 1e3:.3f} ms")
