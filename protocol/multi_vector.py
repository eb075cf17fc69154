"""A multi-vector model's outputs as callers read them (common/contract.py: token vectors packed [kept tokens, dim],
fp16 or fp32, and token_counts [texts, 1]): each text's kept token vectors, and MaxSim."""

from __future__ import annotations

import numpy as np

from common.contract import TOKEN_COUNTS, TOKEN_VECTORS, TOKEN_VECTORS_FP32

from .packed import per_text


def token_vectors(outputs: dict[str, np.ndarray], dtype=None) -> list[np.ndarray]:
    """Each text's kept token vectors [its count, dim]: views of the packed rows, in the precision they came in or,
    widened all at once, in `dtype`."""
    rows = outputs[TOKEN_VECTORS] if TOKEN_VECTORS in outputs else outputs[TOKEN_VECTORS_FP32]
    return per_text(rows if dtype is None else rows.astype(dtype, copy=False), outputs[TOKEN_COUNTS])


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late interaction, as MultiVectorEncoder.similarity scores it (maxsim): the sum over the query's
    vectors of each one's largest dot product with the document's; a document that kept no vector matches
    nothing (0)."""
    if not len(document):
        return 0.0
    return float((query @ document.T).max(axis=1).sum())
