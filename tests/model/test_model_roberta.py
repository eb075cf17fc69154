"""RoBERTa, XLM-RoBERTa and CamemBERT in the torch engine against transformers: BERT's layers with positions that
start after the padding id, no token types (a pair's second text reads the same embedding as its first), and a
classification head of their own."""

from __future__ import annotations

import numpy as np
import pytest

from common.contract import ServingSpec
from tests.model.family_reference import (
    TINY_LAYERS,
    centered_cosine,
    engine_rows,
    gpu,
    interpreted_rows,
    random_pairs,
    random_sequences,
    reference,
    save_checkpoint,
    transformers,
)

CONFIGS = {
    "roberta": transformers.RobertaConfig,
    "xlm-roberta": transformers.XLMRobertaConfig,
    "camembert": transformers.CamembertConfig,
}


def config(model_type: str, **fields):
    # 130 positions: 128 tokens after the padding id's offset of 2.
    return CONFIGS[model_type](**{"vocab_size": 1000, "max_position_embeddings": 130, **TINY_LAYERS, **fields})


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
@pytest.mark.parametrize("task", ["embedding", "classification", "rerank"])
def test_cpu_fp32_matches_transformers(tmp_path, model_type, task):
    model = save_checkpoint(tmp_path, config(model_type), task)
    spec = ServingSpec.load(tmp_path)
    if task == "rerank":
        seqs, _ = random_pairs(0, 24, 1000)
    else:
        seqs = random_sequences(0, 24, 1000, 128)
    out, expected = engine_rows(tmp_path, seqs, precision="fp32"), reference(model, spec, seqs)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_positions_start_after_the_padding_id(tmp_path):
    """A sequence of all 128 tokens reads position rows 2..129: the engine takes 128, refuses 129."""
    save_checkpoint(tmp_path, config("roberta"), "embedding")
    engine_rows(tmp_path, [np.full(128, 7, dtype=np.int32)])
    with pytest.raises(ValueError, match="at most 128"):
        engine_rows(tmp_path, [np.full(129, 7, dtype=np.int32)])


def test_a_pairs_token_types_are_not_read(tmp_path):
    """RoBERTa's tokenizers send no token types and its table has one row: a pair scores the same whatever types
    come with it, as transformers scores it without them."""
    model = save_checkpoint(tmp_path, config("xlm-roberta"), "rerank")
    ids, types = random_pairs(1, 12, 1000)
    with_types = engine_rows(tmp_path, ids, types=types)
    np.testing.assert_array_equal(with_types, engine_rows(tmp_path, ids, types=[np.zeros_like(t) for t in types]))
    np.testing.assert_allclose(with_types, reference(model, ServingSpec.load(tmp_path), ids), atol=2e-5, rtol=1e-4)


def test_triton_kernels_match_torch_ops_under_the_interpreter(tmp_path):
    save_checkpoint(tmp_path, config("roberta"), "embedding")
    kernel_rows, torch_rows = interpreted_rows(tmp_path, random_sequences(2, 8, 1000, 100), tmp_path)
    np.testing.assert_allclose(kernel_rows, torch_rows, atol=2e-6, rtol=0)


@gpu
@pytest.mark.parametrize("task", ["embedding", "rerank"])
def test_gpu_fp16_matches_transformers_fp32(tmp_path, task):
    shape = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}
    model = save_checkpoint(tmp_path, config("xlm-roberta", max_position_embeddings=514, **shape), task)
    spec = ServingSpec.load(tmp_path)
    seqs = random_pairs(3, 96, 1000)[0] if task == "rerank" else random_sequences(3, 96, 1000, 512)
    out = engine_rows(tmp_path, seqs, "cuda:0", precision="fp16")
    expected = reference(model, spec, seqs, device="cuda")
    if task == "embedding":
        assert centered_cosine(out, expected).min() >= 0.999
    else:
        np.testing.assert_allclose(out, expected, atol=0.05 * np.abs(expected).max(), rtol=0)
