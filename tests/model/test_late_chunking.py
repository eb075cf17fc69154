"""Late chunking (stages/late_chunking.py, the torch engine's pool_spans): a text read in one pass, its own tokens
cut into chunks and each chunk's token states mean-pooled, against transformers' last hidden states of the whole
text pooled alike, on a long-context ModernBERT (local and global attention) made in the test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from common.contract import CHUNK_COUNTS, CHUNK_EMBEDDINGS, TOKENS_OUTPUT
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from model_repository.stages.engines import load_engine
from model_repository.stages.late_chunking import LateChunking
from protocol.packed import per_text
from tests.checkpoints import MAX_TOKENS, make_checkpoint
from tests.model.test_engine_torch import gpu
from tests.model.test_stage_execute import Backend, Request, assert_served_as_alone, loaded_stage

LONG_TEXT = " ".join(["Triton batches requests, from many clients, into one call to the model."] * 12)
SIZE = 16


@pytest.fixture(scope="module")
def modernbert(settings, tmp_path_factory):
    """(checkpoint, export) of a tiny ModernBERT embedder (mean pooling, normalized)."""
    folder = tmp_path_factory.mktemp("late")
    checkpoint = make_checkpoint(folder / "checkpoint", "modernbert", "embedding")
    engine = settings.engine
    export(str(checkpoint), "embedding", MAX_TOKENS, folder / "export", engine.onnx_opset, engine.onnx_tolerance)
    return checkpoint, folder / "export"


def stage_of(kind: str, export_dir, settings, monkeypatch, tmp_path):
    chosen = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, max_tokens=MAX_TOKENS),
        engine=dataclasses.replace(settings.engine, kind=kind, precision="fp32"),
    )
    return loaded_stage(monkeypatch, chosen, export_dir, tmp_path / "repo", "pipeline_model")


def reference_chunks(checkpoint, text: str, size: int) -> np.ndarray:
    """transformers' last hidden states of the whole text, each `size` of its own tokens mean-pooled, unit length."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="eager").eval()
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        states = model(input_ids=ids).last_hidden_state[0, 1:-1]  # the text's own tokens, [CLS] and [SEP] left out
    chunks = torch.stack([states[first : first + size].mean(0) for first in range(0, len(states), size)])
    return torch.nn.functional.normalize(chunks, dim=1).numpy()


def test_spans_cut_each_texts_own_tokens_into_chunks():
    """[CLS] own... [SEP]: a span for each special token, chunks of 3 between them, the last shorter; a text of no
    token of its own has no chunk."""
    bounds, per_text, kept = LateChunking(1, 1).spans(np.array([10, 2, 5]), 3)
    assert bounds.tolist() == [0, 1, 4, 7, 9, 10, 11, 12, 13, 16, 17]
    assert per_text.tolist() == [5, 2, 3]
    assert kept.tolist() == [False, True, True, True, False, False, False, False, True, False]


def test_the_torch_stage_answers_the_chunks_of_one_pass(modernbert, settings, monkeypatch, tmp_path):
    """A late request, a plain one and a refused chunk_tokens in one execute: the chunks as transformers' states of the
    whole text pooled per chunk (cosine >= 0.9999), each answer as alone, the refusal naming the parameter."""
    checkpoint, export_dir = modernbert
    stage = stage_of("torch", export_dir, settings, monkeypatch, tmp_path)
    requests = [
        Request([LONG_TEXT, "A short one."], {"chunk_tokens": SIZE}),
        Request(["plain embedding"]),
        Request(["x"], {"chunk_tokens": 0}),
    ]
    together = stage.execute(requests)
    alone = [stage.execute([request])[0] for request in requests[:2]]
    assert "chunk_tokens" in together[2].error.message and together[2].error.code == Backend.TritonError.INVALID_ARG
    assert_served_as_alone(together[:2], alone, 1e-5)
    late = together[0].outputs
    assert set(late) == {CHUNK_EMBEDDINGS, CHUNK_COUNTS, TOKENS_OUTPUT}
    assert len(late[CHUNK_EMBEDDINGS]) == late[CHUNK_COUNTS].sum(), "packed: each text's chunks, no padding"
    texts = [LONG_TEXT, "A short one."]
    for text, chunks in zip(texts, per_text(late[CHUNK_EMBEDDINGS], late[CHUNK_COUNTS]), strict=True):
        expected = reference_chunks(checkpoint, text, SIZE)
        assert len(chunks) == len(expected)
        assert ((chunks * expected).sum(1)).min() >= 0.9999
    stage.finalize()


def test_an_engine_that_pools_whole_sequences_refuses_late_chunks(modernbert, settings, monkeypatch, tmp_path):
    stage = stage_of("onnxruntime_cpu", modernbert[1], settings, monkeypatch, tmp_path)
    late, plain = stage.execute([Request([LONG_TEXT], {"chunk_tokens": SIZE}), Request(["served"])])
    assert "engine kind torch pools spans" in late.error.message
    assert plain.error is None and plain.outputs["embedding"].shape[0] == 1
    stage.finalize()


@gpu
def test_gpu_chunks_are_the_cpu_s(modernbert):
    """The torch engine's pool_spans on the device, its chunks waited for before they are copied out
    (TorchEngine._finished), against the same engine on the CPU."""
    export_dir = modernbert[1]
    ids = np.array(load_tokenizer(export_dir / "tokenizer.json", MAX_TOKENS).encode(LONG_TEXT).ids, dtype=np.int32)
    lengths = np.array([len(ids)])
    bounds = LateChunking(1, 1).spans(lengths, SIZE)[0]
    on_cpu, on_gpu = (load_engine("torch", export_dir, device, {"precision": "fp32"}).pool_spans(ids, lengths, bounds)
                      for device in ("cpu", "cuda"))  # fmt: skip
    assert on_cpu.shape == on_gpu.shape and ((on_cpu * on_gpu).sum(1)).min() >= 0.9999
