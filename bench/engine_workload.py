"""The engine benchmark's workload: BERT-base with random weights, lengths drawn from a lognormal, batches of host
int32 arrays, and how calls are timed (bench/engine_bench.py describes the numbers)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from common.contract import ServingSpec

BATCH_SIZES = (1, 8, 32, 128, 512, 1024)
SIGMA = 0.5
MEAN_LEN = 45
BERT_BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
}


# ----------------------------------------------------------------------------------------------------------
def write_bert_base(folder: Path, seed: int = 0) -> Path:
    """Random BertModel weights with HF names, as transformers' BertModel(BertConfig()) would initialize them."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    c = BERT_BASE
    h, inter = c["hidden_size"], c["intermediate_size"]

    def normal(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).contiguous()

    sd = {
        "embeddings.word_embeddings.weight": normal(c["vocab_size"], h),
        "embeddings.position_embeddings.weight": normal(c["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": normal(c["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": torch.ones(h),
        "embeddings.LayerNorm.bias": torch.zeros(h),
        "pooler.dense.weight": normal(h, h),
        "pooler.dense.bias": torch.zeros(h),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, (o, k) in {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (inter, h),
            "output.dense": (h, inter),
        }.items():
            sd[p + name + ".weight"] = normal(o, k)
            sd[p + name + ".bias"] = torch.zeros(o)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            sd[p + ln + ".weight"] = torch.ones(h)
            sd[p + ln + ".bias"] = torch.zeros(h)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "attention_probs_dropout_prob": 0.1,
        "hidden_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        **c,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    ServingSpec("embedding", "mean", True, h, h, (), 512, 0).save(folder)
    return folder


def draw_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    mu = math.log(MEAN_LEN) - SIGMA**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, SIGMA, size=n)), 8, 128).astype(np.int64)


def draw_batch(rng: np.random.Generator, size: int) -> list[np.ndarray]:
    out = []
    for n in draw_lengths(rng, size):
        ids = rng.integers(1000, 30000, size=int(n), dtype=np.int32)
        ids[0], ids[-1] = 101, 102
        out.append(ids)
    return out


def batches_for(batch_size: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(1234 + batch_size + seed)
    count = int(min(64, max(6, 8192 // batch_size)))
    return [draw_batch(rng, batch_size) for _ in range(count)]


def time_calls(fn, batches, min_calls: int, min_seconds: float) -> dict:
    """Untimed pass over every batch, then rounds over them until both minimums are reached."""
    for b in batches:
        fn(b)
    torch.cuda.synchronize()
    lat, seqs, tokens = [], 0, 0
    start = time.perf_counter()
    while len(lat) < min_calls or time.perf_counter() - start < min_seconds:
        for b in batches:
            t0 = time.perf_counter()
            fn(b)
            lat.append(time.perf_counter() - t0)
            seqs += len(b)
            tokens += sum(len(s) for s in b)
        if len(lat) > 20 * min_calls:
            break
    lat_ms = np.array(lat) * 1e3
    total = float(np.sum(lat))
    return {
        "calls": len(lat),
        "seq_per_s": seqs / total,
        "tokens_per_s": tokens / total,
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "mean_ms": float(lat_ms.mean()),
    }


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def memory_peak(device) -> dict:
    return {
        "max_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
        "max_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20,
    }


def spin_up(device, seconds: float = 2.0) -> None:
    """Busy matrix products first, so that clocks are up before anything is timed."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize(device)
    del a


def settings_engine(settings, device: str):
    """The engine a stage of these settings runs on `device` (one of encoder.gpus, or the CPU without them)."""
    from model_repository.stages.engines import load_engine

    choice = settings.engine_choice()
    options = {"precision": choice.precision, **settings.engine.options}
    return load_engine(choice.kind, settings.export_dir, device, options)
