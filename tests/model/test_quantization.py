"""serving/api/quantization.py: int8/uint8 one symmetric scale from the calibration (127 over its largest |value|
at the rows' width, no offset), the _calibrated forms and binary/ubinary sentence-transformers' quantize_embeddings
bytes and dtypes, on values at and beyond the buckets' edges, for widths that are not a multiple of 8 and for
Matryoshka-truncated rows (the calibration rows cut and renormalized alike)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from serving.api.quantization import Calibration, encoded_rows, quantize, symmetric_scale

LIBRARY_FORMS = {"int8_calibrated": "int8", "uint8_calibrated": "uint8", "binary": "binary", "ubinary": "ubinary"}


def unit_rows(rows: int, width: int, seed: int) -> np.ndarray:
    embeddings = np.random.default_rng(seed).normal(size=(rows, width)).astype(np.float32)
    return embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def ranges() -> np.ndarray:
    calibration = unit_rows(500, 37, seed=1)
    found = np.vstack((calibration.min(axis=0), calibration.max(axis=0)))
    found[:, 5] = 0.25  # a constant dimension: a step of 0, which both read as 1
    return found


@pytest.fixture(scope="module")
def embeddings(ranges) -> np.ndarray:
    rows = unit_rows(64, 37, seed=2)
    steps = (ranges[1] - ranges[0]) / np.float32(255)
    rows[0] = ranges[0] + 17 * steps  # exactly on bucket edges
    rows[1] = ranges[1] + 0.5  # above every range: clipped to 255
    rows[2] = ranges[0] - 0.5  # below: clipped to 0
    rows[3, :8] = 0.0  # zero is not positive: bit 0
    return rows.astype(np.float32)


@pytest.mark.parametrize("precision", LIBRARY_FORMS)
def test_calibrated_and_binary_forms_give_sentence_transformers_bytes(embeddings, ranges, precision):
    ours = quantize(embeddings, precision, ranges)
    theirs = quantize_embeddings(embeddings, precision=LIBRARY_FORMS[precision], ranges=ranges)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert ours.tobytes() == theirs.tobytes()


def test_int8_is_one_symmetric_scale_from_the_largest_calibrated_value(embeddings, ranges):
    scale = 127 / np.abs(ranges).max()
    int8 = quantize(embeddings, "int8", ranges)
    assert int8.dtype == np.int8 and symmetric_scale(ranges) == np.float32(scale)
    np.testing.assert_array_equal(int8[4:], np.clip(np.rint(embeddings[4:] * scale), -127, 127))
    assert (int8[3, :8] == 0).all(), "no offset: 0 is 0"
    assert np.array_equal(quantize(-embeddings, "int8", ranges), -int8), "a row's negation is its int8's"
    assert int8[1].max() == 127 and int8[2].min() == -127, "beyond the calibration: clipped at +-127"


def test_the_calibration_rows_fill_the_int8_range_unclipped():
    calibration = Calibration(unit_rows(500, 37, seed=1))
    scaled = calibration.embeddings * symmetric_scale(calibration.ranges(37))
    assert np.abs(scaled).max() == pytest.approx(127, rel=1e-6), "the largest |value| is 127, nothing beyond it"


def test_uint8_is_the_int8_plus_128(embeddings, ranges):
    uint8 = quantize(embeddings, "uint8", ranges)
    assert uint8.dtype == np.uint8
    np.testing.assert_array_equal(uint8.astype(np.int16) - 128, quantize(embeddings, "int8", ranges))


@pytest.mark.parametrize("precision", ["int8_calibrated", "uint8_calibrated"])
def test_truncated_rows_use_the_calibration_cut_and_renormalized_alike(precision):
    calibration = Calibration(unit_rows(500, 37, seed=1))
    rows = unit_rows(64, 37, seed=2)
    kept = rows[:, :16] / np.linalg.norm(rows[:, :16], axis=1, keepdims=True)
    cut = calibration.embeddings[:, :16] / np.linalg.norm(calibration.embeddings[:, :16], axis=1, keepdims=True)
    ours = quantize(kept, precision, calibration.ranges(16))
    library = LIBRARY_FORMS[precision]
    assert ours.tobytes() == quantize_embeddings(kept, precision=library, calibration_embeddings=cut).tobytes()
    full = quantize(kept, precision, calibration.ranges(37)[:, :16]).astype(np.int16)
    clipped = np.isin(full, (0, 255) if library == "uint8" else (-128, 127))
    assert clipped.mean() > 2 * np.isin(ours.astype(np.int16), (0, 255, -128, 127)).mean(), "the full width's clip"


def test_truncated_int8_takes_its_scale_from_the_calibration_cut_alike():
    calibration = Calibration(unit_rows(500, 37, seed=1))
    cut = calibration.embeddings[:, :16] / np.linalg.norm(calibration.embeddings[:, :16], axis=1, keepdims=True)
    rows = unit_rows(64, 37, seed=2)[:, :16]
    kept = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    scale = 127 / np.abs(cut).max()
    assert symmetric_scale(calibration.ranges(16)) == np.float32(scale)
    int8 = quantize(kept, "int8", calibration.ranges(16))
    np.testing.assert_array_equal(int8, np.clip(np.rint(kept * np.float32(scale)), -127, 127))
    assert scale < symmetric_scale(calibration.ranges(37)), "cut rows, renormalized, hold larger values"


@pytest.mark.parametrize("precision", ["int8", "uint8", "int8_calibrated", "uint8_calibrated"])
def test_float64_ranges_are_read_as_float32(embeddings, ranges, precision):
    as_float64 = quantize(embeddings, precision, ranges.astype(np.float64))
    assert as_float64.tobytes() == quantize(embeddings, precision, ranges).tobytes()


def test_binary_packs_eight_dimensions_a_byte():
    rows = unit_rows(3, 384, seed=3)
    for kind in ("binary", "ubinary"):
        packed = encoded_rows(rows, kind)
        assert [len(row) for row in packed] == [48, 48, 48]
        assert np.array(packed).tobytes() == quantize_embeddings(rows, precision=kind).tobytes()
    signed = np.array(encoded_rows(rows, "binary"), dtype=np.int16)
    assert signed.min() >= -128 and signed.max() <= 127


def test_float_and_base64_rows_keep_the_float32_values():
    rows = unit_rows(2, 8, seed=4)
    decoded = [np.frombuffer(base64.b64decode(row), dtype="<f4") for row in encoded_rows(rows, "base64")]
    assert np.array_equal(np.stack(decoded), rows) and np.array_equal(np.stack(encoded_rows(rows, "float")), rows)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="int4"):
        quantize(unit_rows(1, 8, seed=5), "int4")
