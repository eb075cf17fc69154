"""Each architecture's transformers reference on random token sequences, and the torch engine's rows beside it:
what every tests/model/test_model_<family>.py holds the engine to (CPU fp32; its OpenAI Triton kernels under
Triton's interpreter; the GPU in fp16 and bf16, where there is one).

A checkpoint here is a task model of the family's own transformers config class with random weights, saved as
Hugging Face saves it, with the serving.json export would write. The sequences are random ids: these tests are
about the architecture's numerics; the tokenizers have tests of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from common.contract import ServingSpec
from model_repository.stages.engines import load_engine

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
TASK_LABELS = {"classification": ("negative", "neutral", "positive"), "rerank": ("score",)}
# A tiny encoder of BERT's config names (BERT, RoBERTa's family, MPNet): two layers, four heads.
TINY_LAYERS = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def gpu(test):
    """A GPU test: selected by -m gpu (make test-gpu), skipped where there is no CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA, reason="no CUDA device: runs on the GPU machine")(test))


def save_checkpoint(path: Path, config, task: str, pooling: str = "mean", normalize: bool = False, seed: int = 0):
    """The family's task model (AutoModel, or AutoModelForSequenceClassification for classification and rerank)
    with random weights, saved with its serving.json; returns the fp32 model. A reranker's classifier is scaled so
    that its scores spread (a fresh head gives every pair nearly the same logit)."""
    labels = TASK_LABELS.get(task, ())
    if labels:
        config.num_labels = len(labels)
    torch.manual_seed(seed)
    auto = transformers.AutoModel if task == "embedding" else transformers.AutoModelForSequenceClassification
    model = auto.from_config(config, attn_implementation="eager").eval()
    if task == "rerank":
        with torch.no_grad():
            last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
            last.weight.mul_(40.0)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    hidden = config.hidden_size
    ServingSpec(
        task=task, pooling=pooling, normalize=normalize, hidden_size=hidden,
        output_size=hidden if task == "embedding" else len(labels), labels=labels if task == "classification" else (),
        max_tokens=128, pad_token_id=config.pad_token_id or 0,
    ).save(path)  # fmt: skip
    return model


def random_sequences(seed: int, count: int, vocab: int, longest: int) -> list[np.ndarray]:
    """Ids past the special tokens, lengths 1 to longest (1 and longest included)."""
    rng = np.random.default_rng(seed)
    lengths = [1, longest, *rng.integers(1, longest + 1, size=count - 2)]
    return [rng.integers(5, vocab, size=int(n), dtype=np.int32) for n in lengths]


def random_pairs(seed: int, count: int, vocab: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ids, types) of (query, text) pairs: types 0 for the query's part, 1 for the text's."""
    rng = np.random.default_rng(seed)
    ids, types = [], []
    for query, text in rng.integers(1, 40, size=(count, 2)):
        row = np.concatenate([[0], rng.integers(5, vocab, size=query), [2, 2], rng.integers(5, vocab, size=text), [2]])
        ids.append(row.astype(np.int32))
        types.append(np.array([0] * (query + 3) + [1] * (text + 1), dtype=np.int32))
    return ids, types


def _padded(rows: list[np.ndarray], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.from_numpy(row.astype(np.int64))
        mask[index, : len(row)] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def reference(model, spec: ServingSpec, seqs, types=None, device: str = "cpu", chunk: int = 32) -> np.ndarray:
    """What the model gives each sequence in transformers, fp32: the pooled embedding (sentence-transformers'
    Pooling and Normalize) or the logits (a reranker's first). Token types only where the model reads them."""
    model = model.to(device)
    rows = []
    for start in range(0, len(seqs), chunk):
        ids, mask = _padded(seqs[start : start + chunk], model.config.pad_token_id or 0, device)
        extra = {} if types is None else {"token_type_ids": _padded(types[start : start + chunk], 0, device)[0]}
        out = model(input_ids=ids, attention_mask=mask, **extra)
        if spec.task != "embedding":
            rows.append(out.logits[:, : spec.output_size].float().cpu())
            continue
        hidden, weights = out.last_hidden_state.float(), mask[..., None].float()
        if spec.pooling == "cls":
            pooled = hidden[:, 0]
        elif spec.pooling == "max":
            pooled = hidden.masked_fill(weights == 0, -1e9).max(1).values
        else:
            counts = weights.sum(1)
            pooled = (hidden * weights).sum(1) / (counts if spec.pooling == "mean" else counts.sqrt())
        rows.append((torch.nn.functional.normalize(pooled, dim=1) if spec.normalize else pooled).cpu())
    return torch.cat(rows).numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def centered_cosine(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Cosine after removing the reference's mean row: a random model's embeddings are near-parallel (a wrong row
    still scores a raw cosine of 0.93-0.97), its centred rows are not."""
    mean = ref.mean(0, keepdims=True)
    return cosine(out - mean, ref - mean)


def engine_rows(path: Path, seqs, device: str = "cpu", types=None, **options) -> np.ndarray:
    return load_engine("torch", path, device, options).forward(seqs, types)


# Run in a process of its own: Triton picks its interpreter when the kernels are decorated, at import.
INTERPRETED = """
import sys
import numpy as np
from model_repository.stages.engines import load_engine
data = np.load(sys.argv[2])
rows = []
for options in ({"kernels": "triton", "attention": "triton"}, {"kernels": "torch", "attention": "sdpa"}):
    engine = load_engine("torch", sys.argv[1], "cpu", {"precision": "fp32", **options})
    assert (engine.ops.kernels, engine.ops.attention) == (options["kernels"], options["attention"])
    types = data["types"] if "types" in data else None
    rows.append(engine.forward_packed(data["ids"], data["lengths"], types))
np.save(sys.argv[3], np.stack(rows))
"""


def interpreted_rows(path: Path, seqs, tmp_path: Path, types=None) -> tuple[np.ndarray, np.ndarray]:
    """The engine's rows with its OpenAI Triton kernels (run by Triton's interpreter on the CPU), and with the torch
    ops, on the same packed batch."""
    lengths = np.array([len(row) for row in seqs], dtype=np.int64)
    batch = {"ids": np.concatenate(seqs).astype(np.int32), "lengths": lengths}
    if types is not None:
        batch["types"] = np.concatenate(types).astype(np.int32)
    np.savez(tmp_path / "batch.npz", **batch)
    out = tmp_path / "rows.npy"
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED, str(path), str(tmp_path / "batch.npz"), str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    kernel_rows, torch_rows = np.load(out)
    return kernel_rows, torch_rows
