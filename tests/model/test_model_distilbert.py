"""DistilBERT in the torch engine against transformers: BERT's layers under names of its own, no token types,
its own head (pre_classifier, ReLU, classifier), its activation read from `activation`."""

from __future__ import annotations

import numpy as np
import pytest

from common.contract import ServingSpec
from tests.model.family_reference import (
    centered_cosine,
    engine_rows,
    gpu,
    interpreted_rows,
    random_sequences,
    reference,
    save_checkpoint,
    transformers,
)


def config(**fields):
    tiny = {"n_layers": 2, "dim": 64, "n_heads": 4, "hidden_dim": 128, "vocab_size": 1000}
    return transformers.DistilBertConfig(**{**tiny, **fields})


@pytest.mark.parametrize("task", ["embedding", "classification", "rerank"])
@pytest.mark.parametrize("fields", [{}, {"activation": "relu"}, {"sinusoidal_pos_embds": True}], ids=str)
def test_cpu_fp32_matches_transformers(tmp_path, task, fields):
    model = save_checkpoint(tmp_path, config(**fields), task, pooling="cls")
    seqs = random_sequences(0, 24, 1000, 200)
    out, expected = engine_rows(tmp_path, seqs, precision="fp32"), reference(model, ServingSpec.load(tmp_path), seqs)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_triton_kernels_match_torch_ops_under_the_interpreter(tmp_path):
    save_checkpoint(tmp_path, config(), "classification")
    kernel_rows, torch_rows = interpreted_rows(tmp_path, random_sequences(2, 8, 1000, 100), tmp_path)
    np.testing.assert_allclose(kernel_rows, torch_rows, atol=2e-6, rtol=0)


@gpu
def test_gpu_fp16_matches_transformers_fp32(tmp_path):
    model = save_checkpoint(tmp_path, config(dim=256, n_heads=4, hidden_dim=1024, n_layers=4), "embedding")
    seqs = random_sequences(3, 96, 1000, 512)
    out = engine_rows(tmp_path, seqs, "cuda:0", precision="fp16")
    assert centered_cosine(out, reference(model, ServingSpec.load(tmp_path), seqs, device="cuda")).min() >= 0.999
