"""Task sparse (SPLADE, OpenSearch's neural-sparse doc models) from checkpoint to the stage's outputs: a SparseEncoder
checkpoint exports as sparse, both CPU engines give what sentence-transformers' SparseEncoder.encode gives on real
sentences (a BERT SPLADE, relu; a DistilBERT doc model, log1p_relu), whatever the vocabulary chunk, the precision
"auto" picks for sparse serves the reference's terms in the reference's order, the OpenAI Triton segment max agrees
with torch under the interpreter, and the stage cuts and pads each request's answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.sparse_bench import TIE, top_terms
from common.contract import SPARSE_HEAD_FILE, SPARSE_INDICES, SPARSE_THRESHOLD, SPARSE_TOP_K, SPARSE_VALUES
from common.engine_choice import choose_engine
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from export.checkpoint import CheckpointError
from export.onnx_export import VALIDATION_SENTENCES
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.sparse import SparseRow, SparseRows
from model_repository.stages.sparse_output import SparseOutput, padded_cut
from settings import ROOT
from tests.checkpoints import MAX_TOKENS, make_checkpoint, make_sparse_checkpoint
from tests.model.gpu_copies import SLACK_BYTES, device_to_host_bytes, own_bytes
from tests.model.test_engine_torch import gpu

sentence_transformers = pytest.importorskip("sentence_transformers")

FAMILIES = {"bert": "relu", "distilbert": "log1p_relu"}  # model_type -> SpladePooling activation_function
ENGINES = {"onnxruntime_cpu": {"threads": "2"}, "torch": {"precision": "fp32"}}
LONG_TEXT = " ".join(["Triton batches requests from many clients into one call to the model."] * 80)
ROUNDING = 1e-5  # a weight this small is a logit within fp32 rounding of 0: either side of the relu is right


@dataclass(frozen=True)
class Sparse:
    export_dir: Path
    sequences: list[np.ndarray]
    expected: np.ndarray  # SparseEncoder.encode, dense [texts, vocabulary]


@pytest.fixture(scope="module", params=list(FAMILIES))
def sparse(request, settings, tmp_path_factory) -> Sparse:
    model_type = request.param
    folder = tmp_path_factory.mktemp(f"sparse-{model_type}")
    checkpoint = make_sparse_checkpoint(folder / "checkpoint", model_type, activation=FAMILIES[model_type])
    engine = settings.engine
    export(str(checkpoint), "sparse", MAX_TOKENS, folder / "export", engine.onnx_opset, engine.onnx_tolerance)
    texts = [*VALIDATION_SENTENCES.read_text().splitlines(), LONG_TEXT]
    encoder = sentence_transformers.SparseEncoder(str(checkpoint), device="cpu")
    expected = encoder.encode(texts, convert_to_tensor=True).to_dense().numpy()
    tokenizer = load_tokenizer(folder / "export" / "tokenizer.json", MAX_TOKENS)
    sequences = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(texts)]
    return Sparse(folder / "export", sequences, expected)


def dense(rows: SparseRows, vocabulary: int) -> np.ndarray:
    out = np.zeros((len(rows), vocabulary), dtype=np.float32)
    for row, served in zip(out, rows, strict=True):
        row[served.indices] = served.values
    return out


def assert_sparse_encoder_rows(rows: SparseRows, expected: np.ndarray) -> None:
    """Each row's indices ascending int32 and its weights fp32 > 0; the same entries as SparseEncoder's (but for
    weights within fp32 rounding of 0), each within 1e-4; the batch's rows packed, a text's entries in its place."""
    assert isinstance(rows, SparseRows) and len(rows) == len(expected)
    for row in rows:
        assert row.indices.dtype == np.int32 and row.values.dtype == np.float32
        assert (np.diff(row.indices) > 0).all() and (row.values > 0).all()
    served = dense(rows, expected.shape[1])
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0)
    assert ((served > ROUNDING) == (expected > ROUNDING)).all()
    assert (expected > 0).any(1).all() and (expected > 0).mean() < 0.1  # sparse, but no text empty


def test_a_sparse_encoder_exports_as_sparse(sparse):
    """serving.json: task sparse, the vocabulary as output_size, SpladePooling's activation; the ONNX graph checked
    against the masked-LM model with the engine's head, and the decoder beside it for onnxruntime_cpu."""
    spec = json.loads((sparse.export_dir / "serving.json").read_text())
    report = json.loads((sparse.export_dir / "export_report.json").read_text())
    assert spec["task"] == "sparse" and spec["output_size"] == sparse.expected.shape[1] and spec["pooling"] == "max"
    assert spec["activation"] in FAMILIES.values()
    assert report["relative_diff_onnxruntime_vs_pytorch"] < 1e-5
    assert (sparse.export_dir / SPARSE_HEAD_FILE).is_file()


@pytest.mark.parametrize("kind", list(ENGINES))
def test_the_engines_give_what_the_sparse_encoder_gives(sparse, kind):
    engine = load_engine(kind, sparse.export_dir, "cpu", ENGINES[kind])
    assert_sparse_encoder_rows(engine.forward(sparse.sequences), sparse.expected)


@gpu
def test_gpu_rows_leave_the_gpu_with_their_own_bytes_only(sparse):
    """Each row's columns and values and its count: not a row index an entry, nor the [texts, vocabulary] maxima."""
    engine = load_engine("torch", sparse.export_dir, "cuda", {"precision": "fp16"})
    engine.forward(sparse.sequences)  # a graph's capture, outside the count
    rows, copied = device_to_host_bytes(lambda: engine.forward(sparse.sequences))
    entries = own_bytes(rows.indices, rows.values)
    assert copied <= entries + 4 * len(rows) + SLACK_BYTES, (copied, entries)


@gpu
def test_gpu_rows_are_the_sparse_encoder_s(sparse):
    """fp32 on the device, a graph's capture and then its replay: each batch's entries found once the encoder is done,
    waited for as the dense rows are (TorchEngine._finished)."""
    engine = load_engine("torch", sparse.export_dir, "cuda", {"precision": "fp32"})
    for _ in range(2):
        assert_sparse_encoder_rows(engine.forward(sparse.sequences), sparse.expected)


@pytest.mark.parametrize("kind", list(ENGINES))
def test_any_vocabulary_chunk_gives_the_same_rows(sparse, kind, monkeypatch):
    """Chunks of 256 columns (120 of them over BERT's vocabulary, the last one short) and parts of 64 tokens."""
    engine = load_engine(kind, sparse.export_dir, "cpu", {**ENGINES[kind], "cpu_tokens_per_call": "64"})
    head = engine.head if kind == "onnxruntime_cpu" else engine.model.head
    monkeypatch.setattr(head, "budget" if kind == "onnxruntime_cpu" else "chunk_floats", 256)
    assert_sparse_encoder_rows(engine.forward(sparse.sequences), sparse.expected)


def test_the_default_precision_serves_the_reference_s_terms_in_its_order(sparse):
    """What engine.kind and precision "auto" serve for task sparse on this CPU (common/engine_choice.py): each text's
    terms above 1 % of its largest weight are SparseEncoder's, the same set in the same order of weight, but for
    weights within 1e-5 of each other or of the cut, which fp32 rounding alone orders either way (SparseEncoder at
    two batch sizes does: bench/sparse_bench.py's TIE)."""
    choice = choose_engine("auto", "auto", False, "sparse")
    engine = load_engine(choice.kind, sparse.export_dir, "cpu", {"precision": choice.precision, "threads": "2"})
    served = dense(engine.forward(sparse.sequences), sparse.expected.shape[1])
    check = top_terms(served, sparse.expected)
    assert check["holds_bar"], (choice, check)
    assert check["top_terms_per_text"] > 10
    # The same non-zero terms, but for a weight at relu's edge (an AVX2-only EPYC served 0 for one of 4.8e-7).
    one_side = (served > 0) != (sparse.expected > 0)
    assert (np.maximum(served, sparse.expected)[one_side] <= TIE).all(), check["jaccard_nonzero_min"]


INTERPRETED = """
import sys
import numpy as np
import torch
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.torch_ops import PackedBatch

engine = load_engine("torch", sys.argv[1], "cpu", {"precision": "fp32", "kernels": "triton"})
head, ops = engine.model.head, engine.ops
lens = torch.tensor([1, 7, 40, 130], dtype=torch.int32)
tokens, n = int(lens.sum()) + 29, len(lens)  # a graph bucket's tail: 29 tokens of no sequence
cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0, dtype=torch.int32)])
t = torch.arange(tokens, dtype=torch.int32)
seg = torch.searchsorted(cu[1:], t, right=True, out_int32=True)
ids = torch.zeros(tokens, dtype=torch.int32)  # the head reads the states only
batch = PackedBatch(ids, cu, None, n, int(lens.max()), seg, torch.where(seg < n, t - cu.index_select(0, seg), 0))
x = torch.randn(tokens, engine.model.hidden, generator=torch.Generator().manual_seed(0))
rows = []
for kernels in ("triton", "torch"):
    ops.kernels = kernels
    rows.append(head(x, batch, ops).numpy())
np.save(sys.argv[2], np.stack(rows))
"""


def test_the_segment_max_kernel_matches_torch_under_the_interpreter(sparse, tmp_path):
    """OpenAI Triton's segment max (the GPU path) in Triton's interpreter against torch.segment_reduce, on sequences
    of 1 to 130 tokens and a graph bucket's tail tokens, which no sequence may take."""
    out = tmp_path / "rows.npy"
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED, str(sparse.export_dir), str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    kernel_rows, torch_rows = np.load(out)
    np.testing.assert_allclose(kernel_rows, torch_rows, atol=2e-6, rtol=0)  # GELU, LayerNorm kernels too: 1.1e-6
    assert (torch_rows > 0).any(axis=1).all()


ROW = SparseRow(np.array([3, 9, 12, 40, 41], dtype=np.int32), np.array([0.5, 2.0, 0.1, 2.0, 1.5], dtype=np.float32))


@pytest.mark.parametrize(
    ("top_k", "threshold", "indices"),
    [(0, 0.0, [3, 9, 12, 40, 41]), (2, 0.0, [9, 40]), (3, 0.0, [9, 40, 41]), (0, 0.5, [9, 40, 41]), (1, 1.9, [9])],
)
def test_a_row_is_cut_to_its_largest_entries_above_the_threshold(top_k, threshold, indices):
    """top_k keeps the largest (a tie: the lower index), threshold those above it; the index order stays."""
    tensors = padded_cut(SparseRows.joined([ROW]), top_k, threshold)
    assert tensors[SPARSE_INDICES][0].tolist() == indices
    assert tensors[SPARSE_VALUES][0].tolist() == [float(ROW.values[ROW.indices.tolist().index(i)]) for i in indices]


def test_each_text_of_a_request_is_cut_on_its_own_and_padded_to_the_widest():
    """A text's top_k are its own largest, whatever the other texts hold; -1 and 0 past a text's entries; width at
    least 1 when no text keeps any."""
    low = SparseRow(np.array([1, 2, 5], dtype=np.int32), np.array([0.25, 0.375, 0.125], dtype=np.float32))
    empty = SparseRow(ROW.indices[:0], ROW.values[:0])
    tensors = padded_cut(SparseRows.joined([ROW, low, empty, SparseRow(ROW.indices[:2], ROW.values[:2])]), 2, 0.0)
    assert tensors[SPARSE_INDICES].tolist() == [[9, 40], [1, 2], [-1, -1], [3, 9]]
    assert tensors[SPARSE_VALUES].tolist() == [[2.0, 2.0], [0.25, 0.375], [0, 0], [0.5, 2.0]]
    assert tensors[SPARSE_VALUES].dtype == np.float32 and tensors[SPARSE_INDICES].dtype == np.int32
    whole = padded_cut(SparseRows.joined([ROW, SparseRow(ROW.indices[:2], ROW.values[:2]), empty]), 0, 0.0)
    assert whole[SPARSE_INDICES].tolist() == [[3, 9, 12, 40, 41], [3, 9, -1, -1, -1], [-1] * 5]
    assert padded_cut(SparseRows.joined([empty]), 0, 0.0)[SPARSE_INDICES].shape == (1, 1)
    assert padded_cut(SparseRows.joined([ROW, low]), 0, 5.0)[SPARSE_INDICES].tolist() == [[-1], [-1]]


def test_a_requests_texts_are_a_slice_of_the_batchs_packed_rows():
    """Consecutive texts' entries as views, their offsets from 0; an empty slice; each text's row as it went in."""
    low = SparseRow(np.array([1, 2, 5], dtype=np.int32), np.array([0.25, 0.375, 0.125], dtype=np.float32))
    empty = SparseRow(ROW.indices[:0], ROW.values[:0])
    rows = SparseRows.joined([ROW, empty, low, ROW])
    assert len(rows) == 4 and rows.offsets.tolist() == [0, 5, 5, 8, 13]
    middle = rows[1:3]
    assert middle.offsets.tolist() == [0, 0, 3] and np.shares_memory(middle.indices, rows.indices)
    assert [row.indices.tolist() for row in middle] == [[], [1, 2, 5]]
    assert [row.values.tolist() for row in rows[3:]] == [ROW.values.tolist()]
    assert len(rows[2:2]) == 0 and rows[2:2].offsets.tolist() == [0] and len(rows[2:2].indices) == 0
    assert len(SparseRows.joined([])) == 0


def test_a_requests_parameters_override_the_settings_and_bad_ones_are_named():
    output = SparseOutput({SPARSE_TOP_K: "2", SPARSE_THRESHOLD: "0.0"})
    assert output.options("") == (2, 0.0)
    assert output.options(json.dumps({SPARSE_TOP_K: 0, SPARSE_THRESHOLD: 1})) == (0, 1.0)
    for name, bad in ((SPARSE_TOP_K, -1), (SPARSE_TOP_K, "3"), (SPARSE_THRESHOLD, -0.5), (SPARSE_THRESHOLD, True)):
        with pytest.raises(ValueError, match=name):
            output.options(json.dumps({name: bad}))


def test_the_task_must_agree_with_the_checkpoint(settings, tmp_path):
    """A SparseEncoder is exported as sparse only, an embedder never as sparse, and only BERT and DistilBERT heads."""
    engine = settings.engine
    checkpoint = make_sparse_checkpoint(tmp_path / "splade", "bert")
    with pytest.raises(CheckpointError, match=r'model_type = "SparseEncoder": set model\.task = "sparse"'):
        export(str(checkpoint), "embedding", MAX_TOKENS, tmp_path / "out", engine.onnx_opset, engine.onnx_tolerance)
    embedder = make_checkpoint(tmp_path / "embedder", "bert", "embedding")
    with pytest.raises(CheckpointError, match=r'model_type = "SentenceTransformer": set model\.task = "embedding"'):
        export(str(embedder), "sparse", MAX_TOKENS, tmp_path / "out", engine.onnx_opset, engine.onnx_tolerance)
    with pytest.raises(CheckpointError, match="not roberta"):
        export("random-init:roberta-tiny", "sparse", MAX_TOKENS, tmp_path / "out", 17, 1e-4)
