"""A hybrid model's (BGE-M3's) engine output, and its lexical weights in numpy (export/hybrid_export.py says what
the three outputs are).

The engines give each text's dense vector and every token's weight and colbert vector, packed as the ids came;
a text's lexical weight of token id v is the largest weight of its tokens of id v, the unused ids (BGE-M3's cls,
eos, pad, unk) and weights of 0 left out, as BGEM3FlagModel.encode's lexical_weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from common.contract import (
    HYBRID_GRAPH_OUTPUTS,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TOKEN_COUNTS,
    TOKEN_VECTORS,
    TOKEN_VECTORS_FP32,
)

from .sparse import SparseRows

# What each of the engine's outputs (HYBRID_GRAPH_OUTPUTS) answers: the KServe outputs built from it.
ANSWERS = dict(
    zip(
        HYBRID_GRAPH_OUTPUTS,
        (("embedding",), (SPARSE_INDICES, SPARSE_VALUES), (TOKEN_VECTORS, TOKEN_VECTORS_FP32, TOKEN_COUNTS)),
        strict=True,
    )
)


@dataclass(frozen=True)
class HybridRows:
    """The engine's outputs of a batch; one not wanted is None (a colbert vector is 2 KB of fp16 a token for
    BGE-M3 on a GPU: no copy of them when no request asks for them)."""

    dense: np.ndarray | None  # fp32 [texts, hidden], unit length
    weights: np.ndarray | None  # fp32 [tokens]: each token's ReLU'd lexical weight
    vectors: np.ndarray | None  # fp16 (GPU) or fp32 [tokens - texts, colbert dim]: every token's but each text's
    # first ([CLS], <s>), which BGE-M3's colbert output leaves out, unit length


def colbert_tokens(lengths: np.ndarray) -> np.ndarray:
    """The tokens that get a colbert vector (bool [tokens]): all but each text's first."""
    kept = np.ones(int(lengths.sum()), dtype=bool)
    kept[np.cumsum(lengths) - lengths] = False
    return kept


def wanted_outputs(asked: Iterable[str]) -> frozenset[str]:
    """The engine's outputs that the KServe outputs asked for are built from."""
    asked = set(asked)
    return frozenset(name for name, answers in ANSWERS.items() if asked.intersection(answers))


def lexical_rows(ids: np.ndarray, lengths: np.ndarray, weights: np.ndarray, unused: np.ndarray) -> SparseRows:
    """Each text's (token id, its largest weight) entries, ids ascending: one sort of (text, id) as one int64 key, half
    the time of a lexsort of the two (0.48 against 0.92 ms for 256 texts of 35 tokens on 2 EPYC cores). Equal keys'
    order is free (their maximum is taken), so the sort need not be stable."""
    text = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    keep = weights > 0
    for unused_id in unused.tolist():  # a few special tokens: np.isin's own setup costs more (57 against 8 us)
        keep &= ids != unused_id
    keys = (text[keep] << 32) | ids[keep].astype(np.int64)
    order = np.argsort(keys)
    keys, weights = keys[order], weights[keep][order]
    if not len(keys):
        return SparseRows.of_counts(np.zeros(len(lengths), np.int64), keys, weights)
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    keys = keys[first]
    counts = np.bincount(keys >> 32, minlength=len(lengths))
    return SparseRows.of_counts(counts, keys & 0xFFFFFFFF, np.maximum.reduceat(weights, first))
