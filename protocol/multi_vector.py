"""A multi-vector model's outputs as callers read them (common/contract.py: token_vectors [texts, width, dim],
zeros past each text's own, and token_counts [texts, 1]): each text's kept token vectors, and MaxSim."""

from __future__ import annotations

import numpy as np

from common.contract import TOKEN_COUNTS, TOKEN_VECTORS


def token_vectors(outputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Each text's kept token vectors [its count, dim], its padding dropped."""
    counts = outputs[TOKEN_COUNTS].reshape(-1)
    return [vectors[:count] for vectors, count in zip(outputs[TOKEN_VECTORS], counts.tolist(), strict=True)]


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late interaction, as MultiVectorEncoder.similarity scores it (maxsim): the sum over the query's
    vectors of each one's largest dot product with the document's; a document that kept no vector matches
    nothing (0)."""
    if not len(document):
        return 0.0
    return float((query @ document.T).max(axis=1).sum())
