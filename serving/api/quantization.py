"""Embeddings in the precisions Cohere's `embedding_types` and OpenAI's `encoding_format` name, made in the API
front after pooling (and after `dimensions` truncation): float32 as served, base64 (its little-endian bytes),
int8/uint8 by each dimension's range as calibrated at export (export/calibration.py, calibration.json), and
binary/ubinary by sign, eight dimensions a byte.

The bytes are sentence-transformers' `quantize_embeddings` for the same ranges: the same expressions in the same
dtypes (float32 arithmetic, floor, clip, packbits), so an index built offline with it matches what is served.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from common.contract import CALIBRATION_FILE

FLOATS = ("float", "base64")
QUANTIZED = ("int8", "uint8", "binary", "ubinary")
CALIBRATED = ("int8", "uint8")  # these need the model's ranges; binary needs only the sign


def load_ranges(folder: Path) -> np.ndarray | None:
    """The model's (2, dim) float32 ranges, each dimension's min and max; None for an export without them."""
    path = folder / CALIBRATION_FILE
    if not path.is_file():
        return None
    return np.asarray(json.loads(path.read_text())["ranges"], dtype=np.float32)


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 rows as int8, uint8 (by `ranges`, sliced to the rows' width), binary or ubinary."""
    if precision in CALIBRATED:
        ranges = ranges.astype(np.float32, copy=False)[:, : embeddings.shape[1]]
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
