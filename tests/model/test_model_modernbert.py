"""ModernBERT (models/modernbert.py) against transformers' ModernBertModel and ModernBertForSequenceClassification
(family_reference.py): rotary positions, GeGLU, pre-norm layers, global layers and local ones whose window the test
sequences reach past, the head with either pooling; the rotary, GeGLU and windowed-attention Triton kernels under
Triton's interpreter; sequences of 2,048 and 8,192 tokens; the config.json spellings transformers reads and what
the engine refuses. The GPU tests run where CUDA is (make test-gpu)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.contract import ServingSpec
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.models import presets
from model_repository.stages.engines.models.modernbert import ModernBertEncoder, layer_types, rope_theta
from tests.model.family_reference import (
    ROOT,
    centered_cosine,
    cosine,
    engine_rows,
    gpu,
    interpreted_rows,
    random_pairs,
    random_sequences,
    reference,
    save_checkpoint,
    transformers,
)

TINY = {name: value for name, value in ModernBertEncoder.presets["modernbert-tiny"].items() if name != "model_type"}
WINDOW = TINY["local_attention"] // 2  # 8: the test sequences (up to 100 tokens) reach far past it
# Weights drawn 5x wider than ModernBERT's initializer_range: with 0.02 a random model's attention is nearly uniform
# (ignoring the window moves its rows by 7e-4, its reranker's first-token scores spread by 0.1), with 0.1 by 2e-2 and 3.


def tiny_config(**fields):
    return transformers.ModernBertConfig(**{**TINY, "initializer_range": 0.1, **fields})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(path, transformers model) by name: an embedder (mean pooling), classifiers pooling the first token and the
    tokens' mean, and a reranker."""
    made = {}
    for name, task, pooling in (("embedding", "embedding", "mean"), ("cls", "classification", "cls"),
                                ("mean", "classification", "mean"), ("rerank", "rerank", "cls")):  # fmt: skip
        path = tmp_path_factory.mktemp(name)
        made[name] = path, save_checkpoint(path, tiny_config(classifier_pooling=pooling), task, seed=len(made))
    return made


@pytest.fixture(scope="module")
def sequences() -> list[np.ndarray]:
    return random_sequences(0, 24, TINY["vocab_size"], 100)


def rows_and_reference(checkpoints, name: str, seqs) -> tuple[np.ndarray, np.ndarray]:
    path, model = checkpoints[name]
    return engine_rows(path, seqs), reference(model, ServingSpec.load(path), seqs)


def test_embedding_matches_transformers(checkpoints, sequences):
    out, ref = rows_and_reference(checkpoints, "embedding", sequences)
    assert out.shape == (len(sequences), TINY["hidden_size"])
    assert cosine(out, ref).min() >= 0.9999
    assert np.abs(out - ref).max() < 1e-5  # measured 3.6e-7


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classification_matches_transformers(checkpoints, sequences, pooling):
    """ModernBertForSequenceClassification: the first token or the tokens' mean, dense, GELU, LayerNorm, classifier."""
    out, ref = rows_and_reference(checkpoints, pooling, sequences)
    assert out.shape == (len(sequences), 3)
    assert np.abs(out - ref).max() < 1e-5  # measured 6.0e-7 (cls), 4.8e-7 (mean)
    other = rows_and_reference(checkpoints, "mean" if pooling == "cls" else "cls", sequences)[1]
    assert np.abs(other - ref).max() > 1e-2, "the two classifiers must differ for the pooling to be tested"


def test_rerank_scores_match_transformers(checkpoints):
    """A reranker's pairs: ModernBERT reads no token types, so the engine takes the ids alone; its score is the
    first logit."""
    path, model = checkpoints["rerank"]
    ids, types = random_pairs(3, 24, TINY["vocab_size"])
    out = load_engine("torch", path, "cpu", {}).forward(ids, types)
    ref = reference(model, ServingSpec.load(path), ids)
    assert out.shape == (24, 1) and ref.std() > 1.0, "the scores must spread"
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)  # measured 1.5e-5 on logits of up to 50


def test_biases_and_other_activations_match_transformers(tmp_path, sequences):
    """Every optional bias (attention, MLP, norms, the head's dense), tanh GELU in the GeGLU and ReLU in the head."""
    fields = {"attention_bias": True, "mlp_bias": True, "norm_bias": True, "classifier_bias": True}
    config = tiny_config(**fields, hidden_activation="gelu_pytorch_tanh", classifier_activation="relu")
    model = save_checkpoint(tmp_path, config, "classification")
    with torch.no_grad():  # transformers starts biases at zero (LayerNorms' too): give them values
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    out = engine_rows(tmp_path, sequences)
    assert np.abs(out - reference(model, ServingSpec.load(tmp_path), sequences)).max() < 1e-5  # measured 4.2e-7


# Run in a process of its own: Triton picks its interpreter when the kernels are decorated, at import.
INTERPRETED_BLOCKS = """
import json
import torch
from model_repository.stages.engines.torch_ops import PackedBatch, TorchOps
from model_repository.stages.engines.torch_rotary_glu import GLU_ACTIVATIONS
torch.manual_seed(0)
ops = {kind: TorchOps(torch.float32, False, kind, "sdpa", "exact", False, None) for kind in ("triton", "torch")}
x, up = torch.randn(37, 48), torch.randn(2 * 80, 48) / 48**0.5  # the projection of order 1
worst = {}
for act in GLU_ACTIVATIONS:
    rows = [ops[kind].glu_ffn(x, up, None, act) for kind in ops]
    worst[act] = (rows[0] - rows[1]).abs().max().item()
pos = torch.tensor([0, 1, 2, 0, 1, 8191, 4000, 0, 5], dtype=torch.int32)  # 3 heads of 32 ([T, 3 * 96])
batch = PackedBatch(None, None, None, 0, 0, None, pos)
angles = torch.arange(8192).float()[:, None] * torch.rand(16)
before = torch.randn(9, 3 * 96)
qkv = {kind: before.clone() for kind in ops}
for kind in ops:
    ops[kind].rotary(qkv[kind], batch, angles.cos(), angles.sin())
worst["rotary"] = (qkv["triton"] - qkv["torch"]).abs().max().item()
moved = (qkv["triton"] != before).any(1)
assert torch.equal(qkv["triton"][:, 192:], before[:, 192:]) and torch.equal(moved, pos != 0), moved  # q, k rotated
print(json.dumps(worst))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs OpenAI Triton (the dev extras pin it)")
def test_glu_and_rotary_kernels_match_their_torch_twins_under_the_interpreter():
    """Each GeGLU activation and the rotary kernel (3 heads of 32: masked pairs; positions up to 8,191) in Triton's
    interpreter against the torch twins; the rotary turns q and k of every token past its sequence's first and leaves
    V as it was."""
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED_BLOCKS], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    worst = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(worst) == {"gelu", "gelu_tanh", "relu", "rotary"}
    assert max(worst.values()) < 2e-6, worst  # measured 9.5e-7 (tanh GELU), 7.2e-7 (erf), 0 (ReLU, rotary)


def test_the_local_window_is_applied(checkpoints, sequences):
    """The same engine with its local layers made global gives other rows: the sequences reach past the window, so
    the tests above would fail if it were ignored."""
    path, model = checkpoints["embedding"]
    engine = load_engine("torch", path, "cpu", {})
    ref = reference(model, ServingSpec.load(path), sequences)
    assert max(len(row) for row in sequences) > 4 * WINDOW and engine.model.windows["sliding_attention"] == WINDOW
    engine.model.windows["sliding_attention"] = 0
    assert np.abs(engine.forward(sequences) - ref).max() > 1e-2


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs OpenAI Triton (the dev extras pin it)")
def test_triton_kernels_match_torch_ops_under_the_interpreter(tmp_path):
    """Embedding + LayerNorm without positions, rotary, GeGLU, the windowed varlen attention and pooling in Triton's
    interpreter, against the torch ops and transformers, on a global and a local layer. Sequences of up to 200 tokens
    span several 64-row tiles: with a window of 8, a tile skips key blocks out of its reach, and the first block it
    reads lies wholly outside some of its rows' window."""
    model = save_checkpoint(tmp_path / "model", tiny_config(num_hidden_layers=2), "embedding")
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    seqs = random_sequences(1, 4, TINY["vocab_size"], 200)
    kernel_rows, torch_rows = interpreted_rows(tmp_path / "model", seqs, tmp_path)
    np.testing.assert_allclose(kernel_rows, torch_rows, atol=2e-6, rtol=0)  # measured 3.6e-7
    assert np.abs(kernel_rows - torch_rows).max() > 0, "the two paths ran different code"
    assert np.abs(kernel_rows - reference(model, ServingSpec.load(tmp_path / "model"), seqs)).max() < 1e-5  # 3.6e-7


@pytest.mark.parametrize("lengths", [(2048, 700, 1), (8192,)], ids=["2048", "8192"])
def test_long_sequences_match_transformers(checkpoints, lengths):
    """Up to max_position_embeddings (8,192) tokens a sequence: rotary tables and windows that far. The reference
    is transformers' SDPA attention on the same masks (eager takes 10-20 s at 8,192 tokens on 2 cores)."""
    path = checkpoints["embedding"][0]
    model = transformers.AutoModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
    rng = np.random.default_rng(len(lengths))
    seqs = [rng.integers(5, TINY["vocab_size"], size=n, dtype=np.int32) for n in lengths]
    ref = reference(model, ServingSpec.load(path), seqs)
    assert np.abs(engine_rows(path, seqs) - ref).max() < 1e-5  # measured 7e-8 (2,048), 8e-8 (8,192)
    with pytest.raises(ValueError, match="at most 8192"):
        engine_rows(path, [np.ones(8193, dtype=np.int32)])


@pytest.mark.parametrize("name", ["modernbert-base", "modernbert-tiny"])
def test_config_fields_read_as_transformers_reads_them(name):
    """The presets hold the older spelling of answerdotai/ModernBERT-base's config.json; transformers saves the newer
    one (layer_types, rope_parameters). Both give transformers' layer pattern and thetas."""
    fields = presets()[name]
    config = transformers.ModernBertConfig(**{key: value for key, value in fields.items() if key != "model_type"})
    saved = config.to_dict()
    for spelling in (fields, saved):
        assert layer_types(spelling) == config.layer_types
        for kind in ("full_attention", "sliding_attention"):
            assert rope_theta(spelling, kind) == config.rope_parameters[kind]["rope_theta"]
    thetas = {"full_attention": 5e5, "sliding_attention": 2e4}
    newer = {
        **saved,
        "rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in thetas.items()},
    }
    assert {kind: rope_theta(newer, kind) for kind in thetas} == thetas
    if name == "modernbert-base":
        assert config.layer_types.count("full_attention") == 8 and config.sliding_window == 64
        assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (22, 768, 1152)


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "rope_type 'linear'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"hidden_activation": "silu"}, "activation 'silu'"),
        ({"classifier_activation": "silu"}, "classifier_activation 'silu'"),
        ({"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_what_is_not_served_exactly_is_refused(checkpoints, tmp_path, fields, refused):
    source = checkpoints["cls"][0]
    for name in ("model.safetensors", "serving.json"):
        shutil.copy(source / name, tmp_path / name)
    # The changed config made and saved by transformers itself (rope_scaling comes out as rope_parameters).
    config = transformers.AutoConfig.from_pretrained(source)
    type(config).from_dict({**config.to_dict(), **fields}).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=refused):
        load_engine("torch", tmp_path, "cpu", {})


# ----------------------------------------------------------------------------------------------------------
# GPU: fp16 against transformers fp32, up to 8,192 tokens a sequence
# ----------------------------------------------------------------------------------------------------------
# head_dim 64 and local_attention 128 as ModernBERT-base, fewer and narrower layers
SMALL = {**TINY, "num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 384,
         "local_attention": 128, "initializer_range": 0.1}  # fmt: skip
LONG = (8192, 4100, 2048, 1000, 300, 129, 64, 1)


@gpu
@pytest.mark.parametrize("task", ["embedding", "classification"])
def test_gpu_fp16_long_sequences(tmp_path, task):
    """The default GPU path (Triton kernels, the windowed Triton attention, CUDA graphs) in fp16: centred cosine to
    transformers fp32 at every length up to 8,192, the same rows when a captured graph replays."""
    model = save_checkpoint(tmp_path, transformers.ModernBertConfig(**SMALL), task)  # classifier_pooling mean
    rng = np.random.default_rng(0)
    seqs = [rng.integers(5, SMALL["vocab_size"], size=n, dtype=np.int32) for n in LONG]
    engine = load_engine("torch", tmp_path, "cuda:0", {"precision": "fp16"})
    assert (engine.ops.kernels, engine.ops.attention) == ("triton", "triton")
    ref = np.concatenate([reference(model, ServingSpec.load(tmp_path), [row], device="cuda") for row in seqs])
    out = engine.forward(seqs)
    centred = centered_cosine(out, ref)
    print(f"modernbert {task} fp16: min centred cosine {centred.min():.7f}, max abs {np.abs(out - ref).max():.2e}")
    assert centred.min() >= 0.999, centred  # H200: 0.9999987 (embedding), 0.9999900 (classification)
    assert engine.graph_captures == 1
    np.testing.assert_allclose(engine.forward(seqs), out, atol=1e-6, rtol=0)
    single = np.concatenate([engine.forward([row]) for row in seqs[:3]])
    assert centered_cosine(single, ref[:3]).min() >= 0.999


@gpu
@pytest.mark.parametrize("launch", [{}, {"attn_block_m": 128, "attn_block_n": 32}], ids=["64x64", "128x32"])
def test_gpu_fp16_small_window(tmp_path, launch):
    """A window of 8 under 64- and 128-row query tiles: key blocks wholly outside some rows' window come first."""
    model = save_checkpoint(tmp_path, tiny_config(), "embedding")
    seqs = random_sequences(4, 48, TINY["vocab_size"], 700)
    out = load_engine("torch", tmp_path, "cuda:0", {"precision": "fp16", **launch}).forward(seqs)
    ref = reference(model, ServingSpec.load(tmp_path), seqs, device="cuda")
    centred = centered_cosine(out, ref)
    print(f"modernbert tiny fp16 {launch}: min centred cosine {centred.min():.7f}")
    assert centred.min() >= 0.999, centred  # H200: 0.9999995 under both launches
