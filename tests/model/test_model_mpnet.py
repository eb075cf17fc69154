"""MPNet in the torch engine against transformers: the relative position bias every attention adds (bucketed
distances, exact up to 8 tokens apart, logarithmic to 128, one bucket beyond), positions after the padding id,
RoBERTa's head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.contract import ServingSpec
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.models.mpnet import relative_buckets
from tests.model.family_reference import (
    TINY_LAYERS,
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
    return transformers.MPNetConfig(vocab_size=1000, max_position_embeddings=514, **{**TINY_LAYERS, **fields})


def save_mpnet(path, task: str, **fields):
    """An MPNet checkpoint whose relative position bias is scaled up to what trained models carry (a fresh one,
    std 0.02, barely moves a row)."""
    model = save_checkpoint(path, config(**fields), task)
    with torch.no_grad():
        model.base_model.encoder.relative_attention_bias.weight.mul_(50.0)
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def test_buckets_are_transformers_own():
    distances = torch.arange(-600, 601)[None, :]
    expected = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(distances)
    assert torch.equal(relative_buckets(distances), expected)


@pytest.mark.parametrize("task", ["embedding", "classification", "rerank"])
def test_cpu_fp32_matches_transformers(tmp_path, task):
    """Sequences up to 300 tokens: distances past 128 read the last bucket."""
    model = save_mpnet(tmp_path, task)
    seqs = random_sequences(0, 16, 1000, 300)
    out, expected = engine_rows(tmp_path, seqs, precision="fp32"), reference(model, ServingSpec.load(tmp_path), seqs)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_the_bias_is_read(tmp_path):
    """Without its relative position bias the engine's rows move: the test above would catch a dropped bias."""
    save_mpnet(tmp_path, "embedding")
    seqs = random_sequences(1, 8, 1000, 60)
    engine = load_engine("torch", tmp_path, "cpu", {})
    with_bias = engine.forward(seqs)
    engine.model.bias_table.zero_()
    assert np.abs(engine.forward(seqs) - with_bias).max() > 1e-2


def test_triton_kernels_match_torch_ops_under_the_interpreter(tmp_path):
    save_mpnet(tmp_path, "embedding")
    kernel_rows, torch_rows = interpreted_rows(tmp_path, random_sequences(2, 8, 1000, 200), tmp_path)
    np.testing.assert_allclose(kernel_rows, torch_rows, atol=2e-6, rtol=0)


@gpu
@pytest.mark.parametrize("attention", ["triton", "flash", "sdpa"])
def test_gpu_fp16_matches_transformers_fp32(tmp_path, attention):
    """On the GPU the bias rides in the Triton kernel; FlashAttention takes none, so asking for it gets the kernel."""
    shape = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}
    model = save_mpnet(tmp_path, "embedding", **shape)
    seqs = random_sequences(3, 96, 1000, 512)
    engine = load_engine("torch", tmp_path, "cuda:0", {"precision": "fp16", "attention": attention})
    assert engine.ops.attention == ("sdpa" if attention == "sdpa" else "triton")
    out = engine.forward(seqs)
    assert centered_cosine(out, reference(model, ServingSpec.load(tmp_path), seqs, device="cuda")).min() >= 0.999
