"""The stage's host work for sparse answers, engine excluded: run from a tree's root (PYTHONPATH=.), prints us.

- hybrid (BGE-M3) at 64 and 256 texts, one request: HybridOutput.tensors with the lexical weights asked for
  (bench/hybrid_bench.py's dense+sparse answer), and 1 text;
- SPLADE: a batch of N texts' pooled weights (1 % non-zero of 30,522) through nonzero_rows on the CPU, then one
  request a text (the served 1 x 256), or one request of all (64 x 8's).
Random ids and weights, corpus-like lengths (45 tokens on average)."""

from __future__ import annotations

import sys
import timeit

import numpy as np
import torch

from model_repository.stages.engines.hybrid import HybridRows
from model_repository.stages.engines.torch_sparse import nonzero_rows
from model_repository.stages.hybrid_output import HybridOutput
from model_repository.stages.sparse_output import SparseOutput

PARAMS = {"sparse_top_k": "0", "sparse_threshold": "0"}


class Request:
    def requested_output_names(self) -> list[str]:
        return ["sparse_indices", "sparse_values"]

    def parameters(self) -> str:
        return ""


def best_us(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def hybrid(texts: int, rng: np.random.Generator) -> float:
    lengths = np.clip(np.rint(rng.lognormal(np.log(45) - 0.125, 0.5, texts)), 8, 128).astype(np.int64)
    ids = rng.integers(5, 250_002, int(lengths.sum())).astype(np.int32)
    weights = np.maximum(rng.normal(0.1, 0.2, int(lengths.sum())), 0).astype(np.float32)
    rows = HybridRows(None, weights, None)
    answer = HybridOutput(PARAMS, {"unused_ids": [0, 1, 2, 3]})
    request = Request()
    return best_us(lambda: answer.tensors(rows, ids, lengths, slice(0, texts), slice(0, len(ids)), request), 50)


def splade(texts: int, per_request: int, rng: np.random.Generator) -> tuple[float, float]:
    """(nonzero_rows on the CPU, whose nonzero() a GPU does on the device; the answers, one per request)."""
    pooled = torch.from_numpy(np.where(rng.random((texts, 30_522)) < 0.01, rng.random((texts, 30_522)), 0))
    pooled = pooled.float()
    answer = SparseOutput(PARAMS)
    rows = nonzero_rows(pooled)

    def answers() -> None:
        for start in range(0, texts, per_request):
            answer.tensors(rows[start : start + per_request], "")

    return best_us(lambda: nonzero_rows(pooled), 20), best_us(answers, 20)


def main() -> None:
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    tree = sys.argv[1] if len(sys.argv) > 1 else "."
    for texts in (1, 64, 256):
        print(f"{tree} hybrid {texts} texts, one request: {hybrid(texts, rng):.0f} us")
    for texts, per_request in ((256, 1), (64, 64), (1, 1)):
        rows_us, answers_us = splade(texts, per_request, rng)
        shape = f"{texts} texts, {per_request} a request"
        print(f"{tree} splade {shape}: rows {rows_us:.0f} us, answers {answers_us:.0f} us")


if __name__ == "__main__":
    main()
