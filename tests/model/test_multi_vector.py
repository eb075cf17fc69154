"""Task multi_vector (ColBERT through sentence-transformers' MultiVectorEncoder) from checkpoint to the stage's
outputs: a MultiVectorEncoder checkpoint exports as multi_vector, the stage tokenizes each side as the reference's
preprocess does (prompt, truncation, [MASK] expansion), and onnxruntime_cpu gives, per text, the token vectors
encode_query / encode_document give, which score as the reference's MaxSim."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from common.contract import PROJECTION_FILE, TOKEN_COUNTS, TOKEN_VECTORS, TOKEN_VECTORS_FP32
from common.gpu_board import GpuBoard
from export.__main__ import export
from export.onnx_export import VALIDATION_SENTENCES
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.torch_layout import key_lengths
from model_repository.stages.gpu_turns import GpuTurns
from model_repository.stages.multi_vector_output import MultiVectorSides, kept_counts, vector_outputs
from protocol.multi_vector import token_vectors
from tests.checkpoints import MAX_TOKENS, make_multi_vector_checkpoint
from tests.model import stage_run
from tests.model.gpu_copies import SLACK_BYTES, device_to_host_bytes
from tests.model.test_engine_torch import ROOT, _variant_id, gpu
from tests.model.test_stage_execute import Request, assert_served_as_alone, loaded_stage

sentence_transformers = pytest.importorskip("sentence_transformers")

LONG_TEXT = " ".join(["Triton batches requests, from many clients, into one call to the model."] * 20)
QUERIES = ["What is Triton?", "how do ColBERT's [MASK]s work", "une question en français ?", LONG_TEXT]
# (strategy, attend): PyLate's classic expansion, and one attended with long queries kept whole.
ASK_FP32 = (TOKEN_VECTORS_FP32, TOKEN_COUNTS)
VARIANTS = {"fixed-unattended": ("fixed", False), "min-attended": ("min", True)}


@dataclass(frozen=True)
class MultiVector:
    export_dir: Path
    reference: object  # the MultiVectorEncoder


@pytest.fixture(scope="module", params=list(VARIANTS))
def multi_vector(request, settings, tmp_path_factory) -> MultiVector:
    strategy, attend = VARIANTS[request.param]
    folder = tmp_path_factory.mktemp(f"multi-vector-{request.param}")
    checkpoint = make_multi_vector_checkpoint(folder / "checkpoint", attend=attend, strategy=strategy, bias=attend)
    engine = settings.engine
    export(str(checkpoint), "multi_vector", MAX_TOKENS, folder / "export", engine.onnx_opset, engine.onnx_tolerance)
    reference = sentence_transformers.MultiVectorEncoder(str(checkpoint), device="cpu")
    return MultiVector(folder / "export", reference)


def documents() -> list[str]:
    return [*VALIDATION_SENTENCES.read_text().splitlines()[:12], LONG_TEXT]


def test_a_multi_vector_encoder_exports_its_sides(multi_vector):
    """serving.json: task multi_vector, the projection's width, the prompts, the lengths and the skiplist."""
    spec = json.loads((multi_vector.export_dir / "serving.json").read_text())
    assert spec["task"] == "multi_vector" and spec["output_size"] == 16
    sides = spec["multi_vector"]
    assert (sides["query_prompt"], sides["document_prompt"]) == ("[unused0] ", "[unused1] ")
    assert sides["document_max_tokens"] == 40 and sides["expansion_length"] == 16
    assert sides["skiplist_document"] and not sides["skiplist_query"] and sides["skiplist_ids"]


@pytest.mark.parametrize("side", ["query", "document"])
def test_each_side_tokenizes_as_the_reference(multi_vector, side):
    """Token ids (expansion included) and which of them the encoder attends to: the reference's preprocess."""
    sides = MultiVectorSides(multi_vector.export_dir / "tokenizer.json", _spec(multi_vector))
    texts = QUERIES if side == "query" else documents()
    ids, lengths, attended, _ = sides.encode(texts, side)
    starts = np.cumsum(lengths) - lengths
    reference = multi_vector.reference
    prompt = reference.prompts["query" if side == "query" else "document"]
    for index, text in enumerate(texts):
        features = reference.preprocess([text], prompt=prompt, task=side)
        scored = features["attention_mask"][0].bool() | features.get("query_expansion_positions", features[
            "attention_mask"]).bool()[0]  # fmt: skip
        expected = features["input_ids"][0][scored].numpy()
        row = slice(starts[index], starts[index] + lengths[index])
        np.testing.assert_array_equal(ids[row], expected)
        np.testing.assert_array_equal(attended[row], features["attention_mask"][0][scored].numpy())


def _spec(multi_vector: MultiVector) -> dict:
    return json.loads((multi_vector.export_dir / "serving.json").read_text())["multi_vector"]


def _served(multi_vector: MultiVector, texts: list[str], side: str, engine=None) -> list[np.ndarray]:
    """Each text's kept token vectors as the stage core answers one request of them (default engine:
    onnxruntime_cpu's), in fp32."""
    core = stage_run.stage(multi_vector.export_dir, engine=engine)
    return token_vectors(stage_run.served(core, texts, {"input_type": side}, asked=ASK_FP32))


@pytest.mark.parametrize("side", ["query", "document"])
def test_the_multi_vector_bench_times_the_stage_s_own_answer(multi_vector, settings, side, tmp_path):
    """bench.multi_vector_bench's call is a request's answer as the stage builds it: each text's kept vectors in fp16
    (it once called an old signature, and failed only on the GPU machine); in turns, its first request's."""
    from bench.multi_vector_bench import served_call, stage_core

    engine = load_engine("onnxruntime_cpu", multi_vector.export_dir, options={"threads": "2"})
    core = stage_core(multi_vector.export_dir, engine, settings)
    texts = QUERIES if side == "query" else documents()[:5]
    board = GpuBoard(tmp_path / "board")
    try:
        answers = [served_call(core, side)(texts), served_call(core, side, GpuTurns(board, 0, False, 2, 0, 0.0))(texts)]
    finally:
        board.close()
    for answer, want in zip(
        answers,
        [_served(multi_vector, texts, side, engine), _served(multi_vector, texts[:2], side, engine)],
        strict=True,
    ):
        assert answer[TOKEN_VECTORS].dtype == np.float16
        for got, row in zip(token_vectors(answer), want, strict=True):
            np.testing.assert_array_equal(got, row.astype(np.float16))


@pytest.mark.parametrize("kind", ["onnxruntime_cpu", "torch"])
def test_a_request_gets_its_kept_vectors_packed_in_fp16_unless_it_asks_for_fp32_alone(multi_vector, kind):
    """The engine gives the kept tokens' rows only (a document's punctuation keeps none); the answer is them with no
    padding, text after text, 2 bytes a number by default (a request naming no output asks for all, and gets
    fp16), 4 when it asks for token_vectors_fp32 and not token_vectors; the fp16 ones are the fp32 ones rounded."""
    sides = MultiVectorSides(multi_vector.export_dir / "tokenizer.json", _spec(multi_vector))
    engine = load_engine(kind, multi_vector.export_dir, options={"threads": "2"})
    ids, lengths, attended, kept = sides.encode(documents()[:5], "document")
    assert not kept.all(), "the documents have punctuation, which keeps no vector"
    every = engine.forward_packed(ids, lengths, attended)
    rows = engine.forward_packed(ids, lengths, attended, kept=kept)
    np.testing.assert_array_equal(rows, every[kept])
    counts = kept_counts(lengths, kept)
    wide = vector_outputs(rows, counts, ASK_FP32)
    dim = rows.shape[1]
    assert set(wide) == {TOKEN_VECTORS_FP32, TOKEN_COUNTS}
    assert wide[TOKEN_VECTORS_FP32].dtype == np.float32 and wide[TOKEN_VECTORS_FP32].shape == (kept.sum(), dim)
    for asked in [(), (*ASK_FP32, TOKEN_VECTORS), (TOKEN_VECTORS, TOKEN_COUNTS)]:
        narrow = vector_outputs(rows, counts, asked)
        assert set(narrow) == {TOKEN_VECTORS, TOKEN_COUNTS}
        assert narrow[TOKEN_VECTORS].nbytes == int(kept.sum()) * dim * 2
        np.testing.assert_array_equal(narrow[TOKEN_VECTORS], rows.astype(np.float16))
        np.testing.assert_array_equal(narrow[TOKEN_COUNTS], wide[TOKEN_COUNTS])
    starts = np.cumsum(lengths) - lengths
    expected = [every[start : start + n][kept[start : start + n]] for start, n in zip(starts, lengths, strict=True)]
    for got, want in zip(token_vectors(wide), expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("side", ["query", "document"])
def test_onnxruntime_gives_the_reference_token_vectors(multi_vector, side):
    """Per text the same number of vectors as encode_query / encode_document, each at cosine >= 0.9999."""
    texts = QUERIES if side == "query" else documents()
    encode = multi_vector.reference.encode_query if side == "query" else multi_vector.reference.encode_document
    expected = encode(texts, convert_to_numpy=True)
    for served, reference in zip(_served(multi_vector, texts, side), expected, strict=True):
        assert served.shape == reference.shape
        cosine = (served * reference).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
        assert cosine.min() >= 0.9999


def test_maxsim_of_the_served_vectors_is_the_reference_similarity(multi_vector):
    """MaxSim of each query against each document, summed over the query's vectors: MultiVectorEncoder.similarity."""
    reference = multi_vector.reference
    queries, docs = _served(multi_vector, QUERIES, "query"), _served(multi_vector, documents(), "document")
    scores = np.array([[(q @ d.T).max(1).sum() for d in docs] for q in queries])
    expected = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(documents()))
    np.testing.assert_allclose(scores, expected.numpy(), atol=1e-3, rtol=1e-4)


def test_a_bad_input_type_is_named():
    with pytest.raises(ValueError, match="input_type"):
        MultiVectorSides.side(json.dumps({"input_type": "passage"}))
    assert MultiVectorSides.side("") == "document"


@pytest.mark.parametrize("kind", ["onnxruntime_cpu", "torch"])
def test_one_execute_runs_each_sides_requests_together_as_each_alone(multi_vector, settings, monkeypatch, tmp_path,
                                                                     kind):  # fmt: skip
    """Queries and documents in one dynamic batch, with a request whose side is refused between them: one engine
    call per side, each request gets what it gets alone, the refused one INVALID_ARG naming input_type. On a
    repository generated for either engine (the torch one reads projection.npz beside the weights)."""
    chosen = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, task="multi_vector", max_tokens=MAX_TOKENS),
        engine=dataclasses.replace(settings.engine, kind=kind, precision="fp32"),
    )
    stage = loaded_stage(monkeypatch, chosen, multi_vector.export_dir, tmp_path / "repo", "pipeline_model")
    requests = [
        Request(QUERIES[:2], {"input_type": "query"}),
        Request(documents()[:3], {}),
        Request(["a passage"], {"input_type": "passage"}),
        Request(QUERIES[2:], {"input_type": "query"}),
        Request(documents()[3:5], {"input_type": "document"}),
    ]
    runs, forward = [], stage.engine.forward_packed
    monkeypatch.setattr(
        stage.engine, "forward_packed", lambda *args, **kw: runs.append(len(args[1])) or forward(*args, **kw)
    )
    together = stage.execute(requests)
    assert runs == [4, 5], "one engine call per side: 4 queries, then 5 documents"
    alone = [stage.execute([request])[0] for request in requests]
    stage.finalize()
    assert "input_type" in together[2].error.message and not together[2].outputs
    assert_served_as_alone(together[:2] + together[3:], alone[:2] + alone[3:], 1e-5 if kind == "torch" else 0.0)


def test_a_batch_in_turns_runs_each_sides_chunks_as_each_request_alone(multi_vector, monkeypatch, tmp_path):
    """Beside a query lane (gpu_turns.py) a batch holding ingestion runs in chunks of whole requests, the next one
    tokenized while the engine runs this one: a multi-vector model's too, each side in its own chunks, the refused
    request refused, and each request answered as it is alone."""
    core = stage_run.stage(multi_vector.export_dir)
    requests = [
        stage_run.request(QUERIES[:2], {"input_type": "query"}),
        stage_run.request(documents()[:3]),
        stage_run.request(["a passage"], {"input_type": "passage"}),
        stage_run.request(QUERIES[2:], {"input_type": "query"}),
        stage_run.request(documents()[3:5], {"input_type": "document"}),
    ]
    runs, forward = [], core.engine.forward_packed
    monkeypatch.setattr(
        core.engine, "forward_packed", lambda *args, **kw: runs.append(len(args[1])) or forward(*args, **kw)
    )
    board = GpuBoard(tmp_path / "board")
    try:
        together = core.answer(requests, GpuTurns(board, 0, False, 2, 0, 0.0))
    finally:
        board.close()
    assert runs == [2, 2, 3, 2], "chunks of at most 2 texts, whole requests: the queries', then the documents'"
    alone = [core.answer([held])[0] for held in requests]
    assert "input_type" in together[2] and together[2] == alone[2]
    for shared, single in zip(together[:2] + together[3:], alone[:2] + alone[3:], strict=True):
        assert shared.keys() == single.keys()
        for name, array in shared.items():
            np.testing.assert_array_equal(array, single[name])


# ----------------------------------------------------------------------------------------------------------
# The torch engine: a query's unattended expansion as each sequence's key length (torch_attention.py)
# ----------------------------------------------------------------------------------------------------------
def _cosines(served: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """The lowest cosine of a token's vector to its expected one, after checking each text keeps as many."""
    assert [len(rows) for rows in served] == [len(rows) for rows in expected]
    a, b = np.concatenate(served), np.concatenate(expected)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


@pytest.mark.parametrize("side", ["query", "document"])
@pytest.mark.parametrize("parts", [1024, 48], ids=["one-call", "token-parts"])
def test_torch_gives_onnxruntimes_and_the_reference_token_vectors(multi_vector, side, parts):
    """The torch engine on the CPU (fp32, the grid attention's key mask), in one call and in length-sorted parts:
    per text the vectors onnxruntime_cpu and encode_query / encode_document give, each at cosine >= 0.9999."""
    texts = QUERIES if side == "query" else documents()
    encode = multi_vector.reference.encode_query if side == "query" else multi_vector.reference.encode_document
    engine = load_engine("torch", multi_vector.export_dir, options={"precision": "fp32", "cpu_tokens_per_call": parts})
    served = _served(multi_vector, texts, side, engine)
    assert _cosines(served, _served(multi_vector, texts, side)) >= 0.9999
    assert _cosines(served, list(encode(texts, convert_to_numpy=True))) >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(np.concatenate(served), axis=1), 1.0, atol=1e-5)


def test_torch_projects_without_normalizing_where_the_projection_says_so(multi_vector, tmp_path):
    """A projection file with normalize false (a checkpoint without Normalize): the same directions, not at unit
    length; the export records the flag (true here)."""
    for name in ("config.json", "model.safetensors", "serving.json"):
        shutil.copyfile(multi_vector.export_dir / name, tmp_path / name)
    with np.load(multi_vector.export_dir / PROJECTION_FILE) as arrays:
        assert bool(arrays["normalize"])
        np.savez(tmp_path / PROJECTION_FILE, **{**arrays, "normalize": np.array(False)})
    sides = MultiVectorSides(multi_vector.export_dir / "tokenizer.json", _spec(multi_vector))
    ids, lengths, attended, _ = sides.encode(QUERIES, "query")
    unit = load_engine("torch", multi_vector.export_dir).forward_packed(ids, lengths, attended)
    raw = load_engine("torch", tmp_path).forward_packed(ids, lengths, attended)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.abs(norms - 1).max() > 0.01
    np.testing.assert_allclose(raw / norms, unit, atol=1e-5)


def test_unattended_tokens_must_end_their_sequence():
    lengths = np.array([3, 2])
    np.testing.assert_array_equal(key_lengths(lengths, np.array([1, 1, 0, 1, 1])), [2, 2])
    with pytest.raises(ValueError, match="last ones"):
        key_lengths(lengths, np.array([1, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="none of its tokens"):
        key_lengths(lengths, np.array([1, 1, 1, 0, 0]))


# Run in a process of its own: Triton picks its interpreter when the kernels are decorated, at import.
INTERPRETED_KEYS = """
import sys
import numpy as np
from model_repository.stages.engines import load_engine
batch = np.load(sys.argv[2])
rows = []
for options in ({"kernels": "triton", "attention": "triton"}, {"kernels": "torch", "attention": "sdpa"}):
    engine = load_engine("torch", sys.argv[1], "cpu", {"precision": "fp32", **options})
    assert (engine.ops.kernels, engine.ops.attention) == (options["kernels"], options["attention"])
    rows.append(engine.forward_packed(batch["ids"], batch["lengths"], batch["attended"]))
np.save(sys.argv[3], np.stack(rows))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs OpenAI Triton (the dev extras pin it)")
def test_the_triton_kernels_key_lengths_under_the_interpreter(multi_vector, tmp_path):
    """The GPU path's varlen kernel bounds each sequence's keys by its key length: under Triton's interpreter on
    the CPU, the grid attention's token vectors (queries with their expansion, and documents in one batch)."""
    sides = MultiVectorSides(multi_vector.export_dir / "tokenizer.json", _spec(multi_vector))
    parts = [sides.encode(QUERIES, "query"), sides.encode(documents()[:4], "document")]
    batch = {name: np.concatenate([part[index] for part in parts]) for index, name in
             enumerate(("ids", "lengths", "attended"))}  # fmt: skip
    np.savez(tmp_path / "batch.npz", **batch)
    out = tmp_path / "rows.npy"
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED_KEYS, str(multi_vector.export_dir), str(tmp_path / "batch.npz"), str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    triton_rows, torch_rows = np.load(out)
    np.testing.assert_allclose(triton_rows, torch_rows, atol=2e-5, rtol=0)


@gpu
@pytest.mark.parametrize("side", ["query", "document"])
@pytest.mark.parametrize("variant", [{}, {"cuda_graphs": "false"}, {"attention": "sdpa"}], ids=_variant_id)
def test_gpu_fp16_token_vectors(multi_vector, side, variant):
    """fp16 on the GPU (the Triton kernel with its key lengths in a graph's static buffer, or eager, or the grid
    SDPA), twice (a graph's capture, then its replay): onnxruntime_cpu's vectors at cosine >= 0.999. The rows leave
    the GPU as fp16: 2 bytes a number, the kept tokens' only, and nothing else is copied out."""
    texts = QUERIES if side == "query" else documents()
    expected = _served(multi_vector, texts, side)
    engine = load_engine("torch", multi_vector.export_dir, "cuda", {"precision": "fp16", **variant})
    for _ in range(2):
        assert _cosines(_served(multi_vector, texts, side, engine), expected) >= 0.999
    sides = MultiVectorSides(multi_vector.export_dir / "tokenizer.json", _spec(multi_vector))
    ids, lengths, attended, kept = sides.encode(texts, side)
    rows, copied = device_to_host_bytes(lambda: engine.forward_packed(ids, lengths, attended, kept=kept))
    assert rows.dtype == np.float16 and rows.nbytes == int(kept.sum()) * rows.shape[1] * 2
    assert copied <= rows.nbytes + SLACK_BYTES, (copied, rows.nbytes)
