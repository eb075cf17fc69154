"""A sparse model's outputs as callers read them (common/contract.py: sparse_indices and sparse_values, each
[texts, width] padded to the widest text of a request): several requests' outputs joined (a multi-vector model's
token_vectors padded alike), and each text's entries."""

from __future__ import annotations

import numpy as np

from common.contract import PADDED_OUTPUTS, SPARSE_INDICES, SPARSE_VALUES


def join_outputs(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several requests' outputs by name, one after another; a padded output (sparse entries, token vectors) padded
    along its second axis to the widest of them."""
    joined = {}
    for name in parts[0]:
        arrays = [part[name] for part in parts]
        if name in PADDED_OUTPUTS:
            width = max(array.shape[1] for array in arrays)
            fill = PADDED_OUTPUTS[name]
            arrays = [np.pad(a, [(0, 0), (0, width - a.shape[1])] + [(0, 0)] * (a.ndim - 2), constant_values=fill)
                      for a in arrays]  # fmt: skip
        joined[name] = np.concatenate(arrays)
    return joined


def entries(outputs: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each text's (indices, values), its padding dropped."""
    return [
        (indices[indices >= 0], values[indices >= 0])
        for indices, values in zip(outputs[SPARSE_INDICES], outputs[SPARSE_VALUES], strict=True)
    ]
