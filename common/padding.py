"""Token layouts shared by the stages, the engines and export.

Packed: every sequence's ids one after another (int32 [total]) and each sequence's length (int64 [rows]),
what the tokenizer produces and the engines take (engine.pack_sequences). Padded: int32 [rows, width] ids
right-padded with pad_id and a mask that is 1 on real tokens, what crosses from the tokenizer stage to the
encoder stage and what ONNX Runtime and TensorRT need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _width(longest: int, buckets: Sequence[int]) -> int:
    """The longest row, or with buckets the smallest bucket that holds it (so that requests of similar lengths
    get equal shapes, which a TensorRT encoder needs to batch them together)."""
    return next((bucket for bucket in buckets if bucket >= longest), longest)


def pad_packed(
    ids: np.ndarray, lengths: np.ndarray, pad_id: int, buckets: Sequence[int] = (), starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """int32 (ids, mask) of shape [len(lengths), width] from packed ids, in one pass of array operations.

    Row i holds ids[starts[i] : starts[i] + lengths[i]]; starts default to the packed order.
    """
    if starts is None:
        starts = np.cumsum(lengths) - lengths
    positions = np.arange(_width(int(lengths.max()) if len(lengths) else 0, buckets))
    real = positions[None, :] < lengths[:, None]
    padded = np.full(real.shape, pad_id, dtype=np.int32)
    padded[real] = ids[(starts[:, None] + positions[None, :])[real]]
    return padded, real.astype(np.int32)


def pad_sequences(
    rows: Sequence[Sequence[int] | np.ndarray], pad_id: int, buckets: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """int32 (ids, mask) of shape [len(rows), width] from a list of token sequences (export, tests)."""
    width = _width(max(len(row) for row in rows), buckets)
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return ids, mask


def unpad(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed (ids, lengths) of right-padded [rows, width] ids and their mask (real tokens first in a row)."""
    real = mask != 0
    return ids[real].astype(np.int32, copy=False), real.sum(axis=1, dtype=np.int64)


# What one call on a padded chunk (ONNX Runtime, a CPU attention kernel) costs beyond its tokens, in token
# equivalents (measured order of magnitude on MiniLM: ~1 ms of fixed work per call at ~20-40 us per token).
CALL_COST_TOKENS = 32
# Largest padded chunk, to bound activation memory.
MAX_CHUNK_TOKENS = 16384


def plan_chunks(lengths: np.ndarray) -> list[tuple[int, int]]:
    """Cut ascending lengths into [start, stop) chunks minimizing sum(CALL_COST + rows * longest): where to cut
    a length-sorted batch into padded chunks, chosen by dynamic programming."""
    count = len(lengths)
    best = np.zeros(count + 1)
    cut = np.zeros(count + 1, dtype=np.int64)
    for stop in range(1, count + 1):
        starts = np.arange(stop)
        padded = (stop - starts) * lengths[stop - 1]
        cost = best[:stop] + CALL_COST_TOKENS + np.where(padded <= MAX_CHUNK_TOKENS, padded, np.inf)
        cost[stop - 1] = best[stop - 1] + CALL_COST_TOKENS + lengths[stop - 1]  # a single row always fits
        cut[stop] = int(np.argmin(cost))
        best[stop] = cost[cut[stop]]
    chunks, stop = [], count
    while stop > 0:
        chunks.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return chunks[::-1]
