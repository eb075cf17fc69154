"""export/calibration.py: an embedder's calibration is its unit-length embeddings of the corpus, as
sentence-transformers computes them, written beside serving.json and carried into the generated repository; their
per-dimension min and max are the int8/uint8 ranges; the corpus is read from the settings' file or the shipped
texts, at most MAX_TEXTS lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from common.contract import CALIBRATION_FILE
from export.__main__ import export
from export.calibration import MAX_TEXTS, corpus_texts
from serving.api.quantization import Calibration
from settings import SettingsError
from tests.checkpoints import make_checkpoint

TEXTS = ["Triton batches requests.", "A man is playing a guitar.", "Il pleut à Paris.", "x", "Deep learning " * 30]


def test_ranges_are_the_unit_embeddings_extremes(tmp_path):
    # normalize=False: the checkpoint's rows are not unit length, the served (and calibrated) ones are.
    checkpoint = make_checkpoint(tmp_path / "checkpoint", "bert", "embedding", normalize=False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n\n")
    report = export(str(checkpoint), "embedding", 128, tmp_path / "export", 17, 1e-4, calibration_corpus=corpus)
    calibration = Calibration.load(tmp_path / "export")
    reference = SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS, normalize_embeddings=True)
    expected = np.vstack((reference.min(axis=0), reference.max(axis=0)))
    np.testing.assert_allclose(calibration.ranges(reference.shape[1]), expected, atol=1e-5)
    assert len(calibration.embeddings) == report["calibration"]["texts"] == len(TEXTS), "the empty line is no text"


def test_the_shipped_default_model_is_calibrated(exported, repository):
    calibration = Calibration.load(exported)
    ranges = calibration.ranges(384)
    assert ranges.shape == (2, 384) and (ranges[0] < ranges[1]).all() and len(calibration.embeddings) == MAX_TEXTS
    report = json.loads((exported / "export_report.json").read_text())
    assert report["calibration"]["corpus"] == ["export/validation_sentences.txt", "loadtest/corpus.txt"]
    assert (repository / "ensemble" / "1" / CALIBRATION_FILE).read_bytes() == (exported / CALIBRATION_FILE).read_bytes()


def test_a_long_corpus_is_read_evenly_and_a_bad_one_is_named(tmp_path):
    corpus = tmp_path / "long.txt"
    corpus.write_text("".join(f"text {i}\n" for i in range(2500)))
    texts = corpus_texts(corpus)
    assert len(texts) == MAX_TEXTS and texts[0] == "text 0" and texts[-1] == "text 2499"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(SettingsError, match="holds no text"):
        corpus_texts(empty)
    with pytest.raises(SettingsError, match="cannot read"):
        corpus_texts(tmp_path / "missing.txt")
