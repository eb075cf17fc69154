"""Embeddings in the precisions Cohere's `embedding_types` and OpenAI's `encoding_format` name, made in the API
front after pooling (and after `dimensions` truncation): float32 as served, base64 (its little-endian bytes),
int8/uint8 by each dimension's range over the embeddings calibrated at export (export/calibration.py,
calibration.npy) cut to the rows' width, and binary/ubinary by sign, eight dimensions a byte.

The bytes are sentence-transformers' `quantize_embeddings` for the same ranges: the same expressions in the same
dtypes (float32 arithmetic, floor, clip, packbits), so an index built offline with it matches what is served.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from common.contract import CALIBRATION_FILE

FLOATS = ("float", "base64")
QUANTIZED = ("int8", "uint8", "binary", "ubinary")
CALIBRATED = ("int8", "uint8")  # these need the model's ranges; binary needs only the sign


class Calibration:
    """An embedder's calibration embeddings (unit length, full width) and the (2, width) ranges, each dimension's
    min and max, they give a width: rows cut to `dimensions` are renormalized (schema.shaped), so their ranges are
    those of the calibration rows cut and renormalized alike (the full width's would clip them)."""

    def __init__(self, embeddings: np.ndarray) -> None:
        self.embeddings = embeddings
        self._ranges: dict[int, np.ndarray] = {}  # by width: a route asks for the same few widths again and again

    @classmethod
    def load(cls, folder: Path) -> Calibration | None:
        """The export's calibration; None for an export without one."""
        path = folder / CALIBRATION_FILE
        return cls(np.load(path).astype(np.float32, copy=False)) if path.is_file() else None

    def ranges(self, width: int) -> np.ndarray:
        if width not in self._ranges:
            rows = self.embeddings[:, :width]
            if width < self.embeddings.shape[1]:
                rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            self._ranges[width] = np.vstack((rows.min(axis=0), rows.max(axis=0)))
        return self._ranges[width]


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 rows as int8, uint8 (by `ranges` of the rows' width), binary or ubinary."""
    if precision in CALIBRATED:
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)  # a constant dimension: every value in the first bucket
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)
    packed = np.packbits(embeddings > 0, axis=-1)
    if precision == "ubinary":
        return packed
    if precision == "binary":
        return (packed - 128).astype(np.int8)
    raise ValueError(f"unknown precision {precision!r}")


def encoded_rows(embeddings: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> list:
    """Each row as the answer carries it: numpy rows (orjson writes them as lists of floats or ints) or, for
    base64, the float32 bytes as the OpenAI and Cohere SDKs decode them."""
    if kind == "base64":
        return [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in embeddings]
    if kind == "float":
        return list(embeddings)
    return list(quantize(embeddings, kind, ranges))
