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

import itertools
from collections.abc import Iterator
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


@dataclass(frozen=True)
class SparseRows:
    """A batch's non-zero entries, packed as the engine finds them: text i's are entries offsets[i]:offsets[i + 1].
    A request's texts are a slice of them, and its answer is cut from theirs in one pass (sparse_output.py), with no
    array a text: 2 us a text saved in the split, and as much again in the answer's join (64 texts on 2 cores)."""

    offsets: np.ndarray  # int64 [texts + 1], from 0
    indices: np.ndarray  # int32 [entries], ascending within a text
    values: np.ndarray  # float32 [entries], > 0

    @classmethod
    def of_counts(cls, counts: np.ndarray, indices: np.ndarray, values: np.ndarray) -> SparseRows:
        """Entries sorted by text then index, `counts` of them a text."""
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(offsets, indices.astype(np.int32, copy=False), values.astype(np.float32, copy=False))

    @classmethod
    def joined(cls, rows: list[SparseRow]) -> SparseRows:
        indices = [row.indices for row in rows]
        counts = np.fromiter(map(len, indices), dtype=np.int64, count=len(rows))
        if not rows:
            return cls.of_counts(counts, np.zeros(0, np.int32), np.zeros(0, np.float32))
        return cls.of_counts(counts, np.concatenate(indices), np.concatenate([row.values for row in rows]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, texts: slice) -> SparseRows:
        """Consecutive texts' entries (views)."""
        start, stop, step = texts.indices(len(self))
        assert step == 1, "a request's texts are consecutive"
        first, last = self.offsets[start], self.offsets[max(start, stop)]
        offsets = self.offsets[start : max(start, stop) + 1] - first
        return SparseRows(offsets, self.indices[first:last], self.values[first:last])

    def __iter__(self) -> Iterator[SparseRow]:
        for first, last in itertools.pairwise(self.offsets):
            yield SparseRow(self.indices[first:last], self.values[first:last])


def activate(pooled: np.ndarray, activation: str) -> np.ndarray:
    """log1p of the (already relu'd) max logits in place, twice for log1p_relu."""
    np.log1p(pooled, out=pooled)
    if activation == "log1p_relu":
        np.log1p(pooled, out=pooled)
    return pooled


class NumpySparseHead:
    """The MLM decoder and SpladePooling over packed token states (the graph's MLM-transformed hidden states), in
    fp32 numpy: the vocabulary in chunks of CHUNK_FLOATS logits, each GEMM's max taken per text (reduceat)."""

    def __init__(self, model_dir: Path, activation: str, budget: int = CHUNK_FLOATS) -> None:
        with np.load(Path(model_dir) / SPARSE_HEAD_FILE) as head:
            self.weight = np.ascontiguousarray(head["weight"], dtype=np.float32)  # [vocabulary, hidden]
            self.bias = np.ascontiguousarray(head["bias"], dtype=np.float32)
        self.activation, self.budget = activation, budget

    def __call__(self, states: np.ndarray, lengths: np.ndarray) -> SparseRows:
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
        return SparseRows.of_counts(np.bincount(rows, minlength=len(lengths)), cols[order], values[order])
