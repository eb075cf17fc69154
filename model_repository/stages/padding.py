"""Right-padding of token sequences, shared by the tokenizer stage, the CPU engine and export."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pad_sequences(
    rows: Sequence[Sequence[int] | np.ndarray], pad_id: int, buckets: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """int32 (ids, mask) of shape [len(rows), width]; mask is 1 on real tokens, 0 on padding.

    width is the longest row, or with buckets the smallest bucket that holds it (so that requests of
    similar lengths get equal shapes, which a TensorRT encoder needs to batch them together).
    """
    width = max(len(row) for row in rows)
    width = next((bucket for bucket in buckets if bucket >= width), width)
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return ids, mask
