"""Several requests' outputs as one answer and back (common/contract.py): a packed output (token vectors, late
chunks) goes row after row with its count output beside it; a padded one (sparse entries) is padded to the widest
part. Numpy only, so that what reads a packed output needs no gRPC."""

from __future__ import annotations

import itertools

import numpy as np

from common.contract import PACKED_OUTPUTS, SPARSE_PADDING


def join_outputs(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several requests' outputs by name, one after another: a padded output (sparse entries) padded along its
    second axis to the widest of them, a packed one (token vectors, chunks) row after row as it is."""
    joined = {}
    for name in parts[0]:
        arrays = [part[name] for part in parts]
        if name in SPARSE_PADDING:
            width = max(array.shape[1] for array in arrays)
            fill = SPARSE_PADDING[name]
            arrays = [np.pad(a, [(0, 0), (0, width - a.shape[1])] + [(0, 0)] * (a.ndim - 2), constant_values=fill)
                      for a in arrays]  # fmt: skip
        joined[name] = np.concatenate(arrays)
    return joined


def split_outputs(outputs: dict[str, np.ndarray], texts: list[int]) -> list[dict[str, np.ndarray]]:
    """One call's outputs as the parts of its texts (`texts`: each part's count), views: a packed output's rows by
    its counts, every other output's by text."""
    if len(texts) == 1:
        return [outputs]
    bounds = list(itertools.accumulate(texts, initial=0))
    parts: list[dict[str, np.ndarray]] = [{} for _ in texts]
    for name, rows in outputs.items():
        ends = bounds
        if name in PACKED_OUTPUTS:
            ends = np.concatenate([[0], np.cumsum(outputs[PACKED_OUTPUTS[name]].reshape(-1))])[bounds].tolist()
        for part, start, end in zip(parts, ends, ends[1:], strict=False):
            part[name] = rows[start:end]
    return parts


def per_text(rows: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """A packed output's rows of each text (views), by the texts' counts [texts, 1]."""
    return np.split(rows, np.cumsum(counts.reshape(-1))[:-1])
