"""A sparse model's output (SPLADE, OpenSearch's neural-sparse doc models): each text's non-zero vocabulary weights,
and the head that computes them in numpy for onnxruntime_cpu.

sentence-transformers' SpladePooling (pooling_strategy max) gives a text's weight of vocabulary entry v as
max over the text's tokens (every token the attention mask keeps, [CLS] and [SEP] included) of
log1p(relu(logit[t, v])), log1p twice for activation_function log1p_relu. Both are increasing, so the max is
taken over the raw logits first and the activation applied to [texts, vocabulary] only; a max of 0 is the relu.
The [tokens x vocabulary] logits are never whole: they are computed a chunk of the vocabulary at a time, about
`budget` floats each, and only the non-zero entries leave the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.contract import SPARSE_HEAD_FILE

CHUNK_FLOATS = 1 << 22  # logits per vocabulary chunk (16 MB in fp32): within the caches' reach, GEMMs still wide


@dataclass(frozen=True)
class SparseRow:
    """One text's non-zero entries."""

    indices: np.ndarray  # int32, ascending
    values: np.ndarray  # float32, > 0


def activate(pooled: np.ndarray, activation: str) -> np.ndarray:
    """log1p of the (already relu'd) max logits in place, twice for log1p_relu."""
    np.log1p(pooled, out=pooled)
    if activation == "log1p_relu":
        np.log1p(pooled, out=pooled)
    return pooled


def split_rows(counts: np.ndarray, cols: np.ndarray, values: np.ndarray) -> list[SparseRow]:
    """Entries (column, value), sorted by row then column, as SparseRows of `counts` entries each."""
    ends = np.cumsum(counts)
    starts = ends - counts
    cols, values = cols.astype(np.int32, copy=False), values.astype(np.float32, copy=False)
    return [SparseRow(cols[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)]


class NumpySparseHead:
    """The MLM decoder and SpladePooling over packed token states (the graph's MLM-transformed hidden states), in
    fp32 numpy: the vocabulary in chunks of CHUNK_FLOATS logits, each GEMM's max taken per text (reduceat)."""

    def __init__(self, model_dir: Path, activation: str, budget: int = CHUNK_FLOATS) -> None:
        with np.load(Path(model_dir) / SPARSE_HEAD_FILE) as head:
            self.weight = np.ascontiguousarray(head["weight"], dtype=np.float32)  # [vocabulary, hidden]
            self.bias = np.ascontiguousarray(head["bias"], dtype=np.float32)
        self.activation, self.budget = activation, budget

    def __call__(self, states: np.ndarray, lengths: np.ndarray) -> list[SparseRow]:
        """states: float32 [tokens, hidden], the texts' tokens one after another; lengths: each text's (>= 1)."""
        starts = (np.cumsum(lengths) - lengths).astype(np.intp)
        width = max(256, self.budget // max(1, len(states)))
        found = []
        for first in range(0, len(self.bias), width):
            logits = states @ self.weight[first : first + width].T
            logits += self.bias[first : first + width]
            pooled = activate(np.maximum(np.maximum.reduceat(logits, starts, axis=0), 0.0), self.activation)
            rows, cols = np.nonzero(pooled)
            found.append((rows, cols + first, pooled[rows, cols]))
        rows, cols, values = (np.concatenate(part) for part in zip(*found, strict=True))
        order = np.argsort(rows, kind="stable")  # chunks in vocabulary order: columns stay ascending in a row
        return split_rows(np.bincount(rows, minlength=len(lengths)), cols[order], values[order])
