"""A sparse model's answer to one request: each text's non-zero entries as the engine gives them (SparseRow),
cut as the request asks (KServe parameters sparse_top_k and sparse_threshold, else the settings' [sparse] from
the config's parameters), padded to the request's own widest text: sparse_indices int32 (-1 past a text's
entries) and sparse_values fp32 (0 there), [texts, width]; width is at least 1, so that a request whose texts
keep nothing still gets a tensor of each."""

from __future__ import annotations

import json

import numpy as np

from common.contract import SPARSE_INDICES, SPARSE_PADDING, SPARSE_THRESHOLD, SPARSE_TOP_K, SPARSE_VALUES

from .engines.sparse import SparseRow


def cut(row: SparseRow, top_k: int, threshold: float) -> SparseRow:
    """The entries above threshold, the top_k largest of them (0: all; ties: the lower index), ascending index."""
    keep = row.values > threshold
    indices, values = row.indices[keep], row.values[keep]
    if 0 < top_k < len(values):
        chosen = np.sort(np.argsort(-values, kind="stable")[:top_k])
        indices, values = indices[chosen], values[chosen]
    return SparseRow(indices, values)


def padded(rows: list[SparseRow]) -> dict[str, np.ndarray]:
    """The rows as the two outputs, [texts, the most entries of a text (at least 1)]."""
    width = max(1, *(len(row.indices) for row in rows))
    indices = np.full((len(rows), width), SPARSE_PADDING[SPARSE_INDICES], dtype=np.int32)
    values = np.full((len(rows), width), SPARSE_PADDING[SPARSE_VALUES], dtype=np.float32)
    for index, row in enumerate(rows):
        indices[index, : len(row.indices)] = row.indices
        values[index, : len(row.values)] = row.values
    return {SPARSE_INDICES: indices, SPARSE_VALUES: values}


class SparseOutput:
    """The settings' defaults (config parameters) and each request's own. A SparseEncoder saved with
    max_active_dims keeps that many entries unless the settings or the request say otherwise, as its encode() does."""

    def __init__(self, params: dict[str, str], max_active_dims: int = 0) -> None:
        self.top_k = int(params[SPARSE_TOP_K]) or max_active_dims
        self.threshold = float(params[SPARSE_THRESHOLD])

    def options(self, parameters: str) -> tuple[int, float]:
        """(top_k, threshold) of a request, from its parameters (JSON, as the Python backend gives them);
        ValueError naming a bad one."""
        given = json.loads(parameters or "{}")
        top_k, threshold = given.get(SPARSE_TOP_K, self.top_k), given.get(SPARSE_THRESHOLD, self.threshold)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"parameter {SPARSE_TOP_K} must be an integer >= 0 (0: every entry), not {top_k!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 0:
            raise ValueError(f"parameter {SPARSE_THRESHOLD} must be a number >= 0, not {threshold!r}")
        return top_k, float(threshold)

    def tensors(self, rows: list[SparseRow], parameters: str) -> dict[str, np.ndarray]:
        top_k, threshold = self.options(parameters)
        return padded([cut(row, top_k, threshold) for row in rows])
