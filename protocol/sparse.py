"""A sparse model's outputs as callers read them (common/contract.py: sparse_indices and sparse_values, each
[texts, width] padded to the widest text of a request): each text's entries (packed.join_outputs joins
several requests' outputs)."""

from __future__ import annotations

import numpy as np

from common.contract import SPARSE_INDICES, SPARSE_VALUES


def entries(outputs: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's (indices, values), its padding dropped."""
    return [
        (indices[indices >= 0], values[indices >= 0])
        for indices, values in zip(outputs[SPARSE_INDICES], outputs[SPARSE_VALUES], strict=True)
    ]
