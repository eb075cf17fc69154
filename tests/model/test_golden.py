"""Golden-output regression: the CPU engines reproduce the stored MiniLM embeddings to fp32 rounding.

tests/golden/minilm.npz holds token ids and sentence-transformers fp32 embeddings of 30 real sentences
(python -m tests.golden.make_golden). Both engines here run fp32 on the CPU: measured 2.2e-7 (ONNX Runtime)
and 2.3e-7 (the torch engine's CPU path) at most from the stored values, so 2e-6 fails on any real change (a cosine
of 0.9999 is 100x more). fp16 on a GPU has a tolerance of its own (tests/model/test_engine_torch.py, make test-gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_repository.stages.engines import load_engine

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "minilm.npz"
ATOL = 2e-6
ENGINES = [("onnxruntime_cpu", {"threads": "2"}), ("torch", {"precision": "fp32"})]


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDEN)
    sequences = np.split(data["ids"], np.cumsum(data["lengths"])[:-1])
    return sequences, data["embeddings"]


@pytest.mark.parametrize(("kind", "options"), ENGINES, ids=[kind for kind, _ in ENGINES])
def test_engine_reproduces_golden_embeddings(exported, golden, kind, options):
    sequences, expected = golden
    engine = load_engine(kind, exported, "cpu", options)
    np.testing.assert_allclose(engine.forward(sequences), expected, atol=ATOL, rtol=0)
    # One sequence at a time gives the same rows: nothing depends on the batch's other members.
    singles = np.concatenate([engine.forward([seq]) for seq in sequences[:6]])
    np.testing.assert_allclose(singles, expected[:6], atol=ATOL, rtol=0)
