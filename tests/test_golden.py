"""Golden-output regression: every engine reproduces the stored MiniLM embeddings (rtol/atol 1e-3).

tests/golden/minilm.npz holds token ids and sentence-transformers fp32 embeddings of 30 real sentences
(python -m tests.golden.make_golden). CPU engines run here in CI; the GPU engine where CUDA exists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model_repository.stages.engine import load_engine

GOLDEN = Path(__file__).parent / "golden" / "minilm.npz"
ENGINES = [
    ("onnxruntime_cpu", "cpu", {"threads": "2"}),
    ("torch_gpu", "cpu", {"precision": "fp32"}),
    pytest.param(
        "torch_gpu", "cuda:0", {"precision": "fp16"},
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: runs on the GPU machine"),
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDEN)
    sequences = np.split(data["ids"], np.cumsum(data["lengths"])[:-1])
    return sequences, data["embeddings"]


@pytest.mark.parametrize(("kind", "device", "options"), ENGINES)
def test_engine_reproduces_golden_embeddings(exported, golden, kind, device, options):
    sequences, expected = golden
    engine = load_engine(kind, exported, device, options)
    np.testing.assert_allclose(engine.forward(sequences), expected, rtol=1e-3, atol=1e-3)
    # One sequence at a time gives the same rows: nothing depends on the batch's other members.
    singles = np.concatenate([engine.forward([seq]) for seq in sequences[:6]])
    np.testing.assert_allclose(singles, expected[:6], rtol=1e-3, atol=1e-3)
