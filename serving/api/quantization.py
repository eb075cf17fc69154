"""Embeddings in the precisions Cohere's `embedding_types` and OpenAI's `encoding_format` name, made in the API
front after pooling (and after `dimensions` truncation): float32 as served, base64 (its little-endian bytes),
int8/uint8 by one symmetric scale, int8_calibrated/uint8_calibrated by each dimension's range, and binary/ubinary
by sign, eight dimensions a byte.

int8 is round(value * 127 / m), clipped to +-127, where m is the largest |value| of the embeddings calibrated at
export (export/calibration.py, calibration.npy) cut to the rows' width; uint8 is that int8 + 128. No offset: the
dot product of two int8 rows is their float dot product times (127 / m)^2, so int8 rows rank pairs as the floats
do by dot product and by cosine (a Spearman of 0.9998+ on MiniLM, docs/results/cpu-2026-12-04/int8/), and a uint8
row ranks so once 128 is taken off. The _calibrated forms are sentence-transformers' `quantize_embeddings` for
the calibration's ranges, 256 buckets between each dimension's min and max (the same expressions in the same
dtypes: float32 arithmetic, floor, clip, packbits), so an index built offline with it matches what is served;
their per-dimension offsets make raw dot products rank pairs far from the floats (~0.8). binary/ubinary are
`quantize_embeddings`' bytes too.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from common.contract import CALIBRATION_FILE

FLOATS = ("float", "base64")
QUANTIZED = ("int8", "uint8", "binary", "ubinary", "int8_calibrated", "uint8_calibrated")
CALIBRATED = ("int8", "uint8", "int8_calibrated", "uint8_calibrated")  # these need the ranges; binary, the sign
SYMMETRIC_MAX = 127  # +-127, not -128: a row and its negation quantize to each other's negation


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


def symmetric_scale(ranges: np.ndarray) -> np.float32:
    """127 over the largest |value| the ranges hold: that of the calibration rows of their width."""
    return np.float32(SYMMETRIC_MAX) / np.abs(ranges.astype(np.float32, copy=False)).max()


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 rows as int8, uint8, int8_calibrated, uint8_calibrated (by `ranges` of the rows' width), binary or
    ubinary."""
    if precision in ("int8", "uint8"):
        scaled = np.clip(np.rint(embeddings * symmetric_scale(ranges)), -SYMMETRIC_MAX, SYMMETRIC_MAX)
        return (scaled + 128).astype(np.uint8) if precision == "uint8" else scaled.astype(np.int8)
    if precision in ("int8_calibrated", "uint8_calibrated"):
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)  # a constant dimension: every value in the first bucket
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8_calibrated" else (buckets - 128).astype(np.int8)
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
