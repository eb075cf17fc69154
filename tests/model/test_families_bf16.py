"""bf16 for every family against transformers fp32: on the CPU (bf16 GEMM operands, everything else fp32) the
cosine bar is 0.999, on the GPU (bf16 throughout, fp32 statistics) the same. Centred cosines: a random model's
embeddings are near-parallel, so a raw cosine would pass wrong rows."""

from __future__ import annotations

import pytest

from common.contract import ServingSpec
from tests.model.family_reference import (
    centered_cosine,
    engine_rows,
    gpu,
    random_sequences,
    reference,
    save_checkpoint,
    transformers,
)

LAYERS = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
CONFIGS = {
    "bert": lambda: transformers.BertConfig(vocab_size=1000, **LAYERS),
    "roberta": lambda: transformers.RobertaConfig(vocab_size=1000, max_position_embeddings=514, **LAYERS),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(vocab_size=1000, max_position_embeddings=514, **LAYERS),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=1000, n_layers=2, dim=64, n_heads=4, hidden_dim=128),
    "mpnet": lambda: transformers.MPNetConfig(vocab_size=1000, max_position_embeddings=514, **LAYERS),
    "modernbert": lambda: transformers.ModernBertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
        local_attention=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_cpu_bf16_gemms_keep_the_cosine_bar(tmp_path, model_type):
    model = save_checkpoint(tmp_path, CONFIGS[model_type](), "embedding")
    seqs = random_sequences(0, 32, 1000, 200)
    out = engine_rows(tmp_path, seqs, precision="bf16")
    cosine = centered_cosine(out, reference(model, ServingSpec.load(tmp_path), seqs))
    assert 0.999 <= cosine.min() < 0.9999999, cosine  # bf16 operands show in the numerics: not the fp32 path


@gpu
@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_gpu_bf16_keeps_the_cosine_bar(tmp_path, model_type):
    model = save_checkpoint(tmp_path, CONFIGS[model_type](), "embedding")
    seqs = random_sequences(1, 64, 1000, 300)
    out = engine_rows(tmp_path, seqs, "cuda:0", precision="bf16")
    assert centered_cosine(out, reference(model, ServingSpec.load(tmp_path), seqs, device="cuda")).min() >= 0.999
