"""A hybrid model's (BGE-M3's) engine output, and its lexical weights in numpy (export/hybrid_export.py says what
the three outputs are).

The engines give each text's dense vector and every token's weight and colbert vector, packed as the ids came;
a text's lexical weight of token id v is the largest weight of its tokens of id v, the unused ids (BGE-M3's cls,
eos, pad, unk) and weights of 0 left out, as BGEM3FlagModel.encode's lexical_weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sparse import SparseRow, split_rows


@dataclass(frozen=True)
class HybridRows:
    dense: np.ndarray  # fp32 [texts, hidden], unit length
    weights: np.ndarray  # fp32 [tokens]: each token's ReLU'd lexical weight
    vectors: np.ndarray  # fp32 [tokens, colbert dim], unit length (each text's first token's too)


def lexical_rows(ids: np.ndarray, lengths: np.ndarray, weights: np.ndarray, unused: np.ndarray) -> list[SparseRow]:
    """Each text's (token id, its largest weight) entries, ids ascending."""
    text = np.repeat(np.arange(len(lengths)), lengths)
    keep = (weights > 0) & ~np.isin(ids, unused)
    text, ids, weights = text[keep], ids[keep], weights[keep]
    order = np.lexsort((ids, text))
    text, ids, weights = text[order], ids[order], weights[order]
    if not len(ids):
        return split_rows(text, ids, weights, len(lengths))
    first = np.flatnonzero(np.r_[True, (np.diff(ids) != 0) | (np.diff(text) != 0)])
    return split_rows(text[first], ids[first], np.maximum.reduceat(weights, first), len(lengths))
