"""Task hybrid (BGE-M3) from checkpoint to the stage's outputs: a checkpoint laid out as BAAI/bge-m3's exports as
hybrid, and one execute() answers each request the outputs it asks for, each as FlagEmbedding's BGEM3FlagModel
encodes it: the dense vector, the lexical weights (same token ids, weights within 1e-4) and the colbert vectors
(same count, cosine >= 0.9999)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from common.contract import (
    HYBRID_HEADS_FILE,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TOKEN_COUNTS,
    TOKEN_VECTORS,
    TOKEN_WEIGHTS,
    TOKENS_OUTPUT,
)
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from export.checkpoint import CheckpointError
from export.onnx_export import VALIDATION_SENTENCES
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.engines.torch_engine import TorchEngine
from protocol.multi_vector import token_vectors
from protocol.sparse import entries
from tests.checkpoints import MAX_TOKENS, make_checkpoint, make_hybrid_checkpoint
from tests.model.flag_reference import m3_embedder
from tests.model.gpu_copies import SLACK_BYTES, device_to_host_bytes, own_bytes
from tests.model.test_engine_torch import gpu
from tests.model.test_stage_execute import Backend, Request, assert_served_as_alone, loaded_stage

LONG_TEXT = " ".join(["Triton batches requests, from many clients, into one call to the model."] * 20)
ALL = ("embedding", SPARSE_INDICES, SPARSE_VALUES, TOKEN_VECTORS, TOKEN_COUNTS, TOKENS_OUTPUT)
MEANINGFUL = 1e-5  # a lexical weight this small is a ReLU input within rounding of 0: either side of it is right


@dataclass(frozen=True)
class Hybrid:
    export_dir: Path
    reference: dict  # BGEM3FlagModel.encode's dense_vecs, lexical_weights and colbert_vecs of TEXTS


TEXTS = [*VALIDATION_SENTENCES.read_text().splitlines()[:12], "Triton Triton Triton", LONG_TEXT]


@pytest.fixture(scope="module")
def hybrid(settings, tmp_path_factory) -> Hybrid:
    folder = tmp_path_factory.mktemp("hybrid")
    checkpoint = make_hybrid_checkpoint(folder / "checkpoint")
    engine = settings.engine
    export(str(checkpoint), "hybrid", MAX_TOKENS, folder / "export", engine.onnx_opset, engine.onnx_tolerance)
    with pytest.MonkeyPatch.context() as monkeypatch:
        reference = m3_embedder(monkeypatch)(str(checkpoint), use_fp16=False, devices="cpu")
        encoded = reference.encode(
            TEXTS, max_length=MAX_TOKENS, return_dense=True, return_sparse=True, return_colbert_vecs=True
        )
    return Hybrid(folder / "export", encoded)


@pytest.fixture(params=["onnxruntime_cpu", "torch"])
def stage(hybrid, settings, monkeypatch, tmp_path, request):
    """The one-stage model on a repository generated for the engine (the torch one reads the heads' file)."""
    chosen = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, task="hybrid", max_tokens=MAX_TOKENS),
        engine=dataclasses.replace(settings.engine, kind=request.param, precision="fp32"),
    )
    instance = loaded_stage(monkeypatch, chosen, hybrid.export_dir, tmp_path / "repo", "pipeline_model")
    yield instance
    instance.finalize()


def test_a_bge_m3_checkpoint_exports_its_heads(hybrid):
    """serving.json: task hybrid, the dense width, the colbert width and the ids without a lexical weight (<s>,
    <pad>, </s>, <unk>); both heads saved for the torch engine."""
    spec = json.loads((hybrid.export_dir / "serving.json").read_text())
    assert (spec["task"], spec["pooling"], spec["normalize"], spec["output_size"]) == ("hybrid", "cls", True, 64)
    assert spec["hybrid"] == {"colbert_size": 64, "unused_ids": [0, 1, 2, 3]}
    assert spec["multi_vector"]["expansion_id"] is None and not spec["multi_vector"]["skiplist_ids"]
    with np.load(hybrid.export_dir / HYBRID_HEADS_FILE) as heads:
        assert heads["sparse_weight"].shape == (1, 64) and heads["colbert_weight"].shape == (64, 64)


def test_one_execute_gives_the_references_three_outputs(hybrid, stage):
    """Dense within 1e-5, the same lexical token ids with weights within 1e-4, the same colbert vector count per
    text at cosine >= 0.9999, and the token counts the tokenizer gave."""
    (response,) = stage.execute([Request(TEXTS, asked=ALL)])
    assert response.error is None and set(response.outputs) == set(ALL)
    reference = hybrid.reference
    np.testing.assert_allclose(response.outputs["embedding"], reference["dense_vecs"], atol=1e-5)
    for (indices, values), expected in zip(entries(response.outputs), reference["lexical_weights"], strict=True):
        served = dict(zip(indices.tolist(), values.tolist(), strict=True))
        wanted = {int(key): float(value) for key, value in expected.items()}
        assert {k for k, v in served.items() if v > MEANINGFUL} == {k for k, v in wanted.items() if v > MEANINGFUL}
        for key in served.keys() & wanted.keys():
            assert served[key] == pytest.approx(wanted[key], abs=1e-4)
    counts = response.outputs[TOKENS_OUTPUT].reshape(-1)
    for vectors, expected, count in zip(
        token_vectors(response.outputs, np.float32), reference["colbert_vecs"], counts, strict=True
    ):
        assert vectors.shape == expected.shape == (count - 1, 64)
        cosine = (vectors * expected).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() >= 0.9999


def test_each_request_gets_what_it_asks_for_as_alone(stage):
    """One batch: dense only, sparse cut to its top 3, colbert only, a refused sparse_top_k, and everything: each
    response is what its request gets alone, the refused one INVALID_ARG naming the parameter."""
    requests = [
        Request(TEXTS[:2], asked=("embedding", TOKENS_OUTPUT)),
        Request(TEXTS[2:5], {"sparse_top_k": 3}, (SPARSE_INDICES, SPARSE_VALUES)),
        Request(TEXTS[5:6], asked=(TOKEN_VECTORS, TOKEN_COUNTS)),
        Request(TEXTS[6:7], {"sparse_top_k": -1}, (SPARSE_INDICES, SPARSE_VALUES)),
        Request(TEXTS[7:], asked=ALL),
    ]
    together = stage.execute(requests)
    alone = [stage.execute([request])[0] for request in requests]
    assert [set(response.outputs) - {TOKENS_OUTPUT} for response in together[:3]] == [
        {"embedding"},
        {SPARSE_INDICES, SPARSE_VALUES},
        {TOKEN_VECTORS, TOKEN_COUNTS},
    ]
    assert (together[1].outputs[SPARSE_INDICES] >= 0).sum(1).max() == 3
    assert together[3].error.code == Backend.TritonError.INVALID_ARG and "sparse_top_k" in together[3].error.message
    # Its GEMMs round by the batch's shape: up to 3.05e-5 on an AVX2-only EPYC (1 of 2,368 colbert floats).
    atol = 1e-4 if isinstance(stage.engine, TorchEngine) else 0.0
    assert_served_as_alone([*together[:3], together[4]], [*alone[:3], alone[4]], atol)


def test_a_checkpoint_without_the_heads_is_refused(settings, tmp_path):
    """task hybrid of a plain XLM-RoBERTa embedder: refused, naming the missing files."""
    checkpoint = make_checkpoint(tmp_path / "xlmr", "xlm-roberta", "embedding", pooling="cls")
    engine = settings.engine
    with pytest.raises(CheckpointError, match=r"colbert_linear\.pt"):
        export(str(checkpoint), "hybrid", MAX_TOKENS, tmp_path / "export", engine.onnx_opset, engine.onnx_tolerance)


def _packed_texts(export_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    tokenizer = load_tokenizer(export_dir / "tokenizer.json", MAX_TOKENS)
    return pack_sequences([np.array(e.ids, np.int32) for e in tokenizer.encode_batch(TEXTS)])


def _engine_rows(export_dir: Path, kind: str, device: str = "cpu", wanted=None, **options):
    """The engine's HybridRows of TEXTS (the wanted outputs)."""
    engine = load_engine(kind, export_dir, device, {"threads": "2", **options})
    return engine.forward_packed(*_packed_texts(export_dir), None, wanted)


def _assert_same_rows(got, want, cosine: float) -> None:
    for name in ("dense", "vectors"):
        a, b = getattr(got, name).astype(np.float32), getattr(want, name)
        assert a.shape == b.shape
        assert ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min() >= cosine
    np.testing.assert_allclose(got.weights, want.weights, atol=1e-3 if cosine < 0.9999 else 1e-5)


@pytest.mark.parametrize("tokens_per_call", [1024, 64], ids=["one-call", "token-parts"])
def test_the_torch_engine_gives_onnxruntimes_rows(hybrid, tokens_per_call):
    """The torch engine on the CPU (fp32), in one call or in parts of 64 tokens: onnxruntime_cpu's dense vectors,
    token weights and colbert vectors."""
    want = _engine_rows(hybrid.export_dir, "onnxruntime_cpu")
    got = _engine_rows(hybrid.export_dir, "torch", cpu_tokens_per_call=str(tokens_per_call))
    _assert_same_rows(got, want, 0.9999)


@gpu
@pytest.mark.parametrize("variant", [{}, {"cuda_graphs": "false"}], ids=["graphs", "eager"])
def test_gpu_fp16_rows(hybrid, variant):
    """fp16 on the GPU, twice (a graph's capture, then its replay): onnxruntime_cpu's rows at cosine >= 0.999; the
    colbert vectors leave the GPU as fp16."""
    want = _engine_rows(hybrid.export_dir, "onnxruntime_cpu")
    for _ in range(2):
        got = _engine_rows(hybrid.export_dir, "torch", "cuda", precision="fp16", **variant)
        _assert_same_rows(got, want, 0.999)
        assert got.vectors.dtype == np.float16


@gpu
@pytest.mark.parametrize("wanted", [None, frozenset({"embedding", TOKEN_WEIGHTS})], ids=["all", "no-colbert"])
def test_gpu_rows_leave_the_gpu_with_their_own_bytes_only(hybrid, wanted):
    """The wanted outputs' rows, the kept tokens' colbert vectors in fp16, and nothing else."""
    ids, lengths = _packed_texts(hybrid.export_dir)
    engine = load_engine("torch", hybrid.export_dir, "cuda", {"precision": "fp16"})
    engine.forward_packed(ids, lengths, None, wanted)  # a graph's capture, outside the count
    rows, copied = device_to_host_bytes(lambda: engine.forward_packed(ids, lengths, None, wanted))
    assert copied <= own_bytes(rows.dense, rows.weights, rows.vectors) + SLACK_BYTES


@pytest.mark.parametrize("kind", ["onnxruntime_cpu", "torch"])
def test_an_engine_copies_out_only_the_wanted_outputs(hybrid, kind):
    """Dense and token weights wanted, colbert vectors not (4 KB a token for BGE-M3): None, the others as when all
    three are wanted."""
    everything = _engine_rows(hybrid.export_dir, kind)
    some = _engine_rows(hybrid.export_dir, kind, wanted=frozenset({"embedding", TOKEN_WEIGHTS}))
    assert some.vectors is None
    np.testing.assert_array_equal(some.dense, everything.dense)
    np.testing.assert_array_equal(some.weights, everything.weights)
