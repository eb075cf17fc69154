"""The stage's answer to one request asking for all of BGE-M3's outputs (HybridOutput.tensors), timed alone on
random rows of BGE-M3's widths: python docs/results/cpu-2026-12-05/hybrid-answer/answer_probe.py, from the root of
the tree to time."""

import time

import numpy as np

from common.contract import (
    SPARSE_INDICES,
    SPARSE_THRESHOLD,
    SPARSE_TOP_K,
    SPARSE_VALUES,
    TOKEN_COUNTS,
    TOKEN_VECTORS,
)
from model_repository.stages.engines.hybrid import HybridRows
from model_repository.stages.hybrid_output import HybridOutput


class Request:
    def requested_output_names(self):
        return ("embedding", SPARSE_INDICES, SPARSE_VALUES, TOKEN_VECTORS, TOKEN_COUNTS)

    def parameters(self):
        return "{}"


rng = np.random.default_rng(0)
for top_k in ("0", "64"):
    output = HybridOutput({SPARSE_TOP_K: top_k, SPARSE_THRESHOLD: "0"}, {"unused_ids": [0, 1, 2, 3]})
    for texts in (64, 256):
        lengths = np.clip(rng.lognormal(np.log(35), 0.5, texts).astype(int), 8, 512)
        tokens = int(lengths.sum())
        ids = rng.integers(5, 250_000, tokens).astype(np.int32)
        rows = HybridRows(
            rng.standard_normal((texts, 1024)).astype(np.float32),
            np.maximum(rng.standard_normal(tokens).astype(np.float32), 0),
            rng.standard_normal((tokens - texts, 1024)).astype(np.float16),
        )
        every = (slice(0, texts), slice(0, tokens))
        output.tensors(rows, ids, lengths, *every, Request())
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                output.tensors(rows, ids, lengths, *every, Request())
            times.append((time.perf_counter() - start) / 20 * 1e3)
        print(f"top_k {top_k} texts {texts} tokens {tokens}: best {min(times):.3f} ms, median {np.median(times):.3f}")
