"""Where a ColBERT document batch's time goes on the served path (bench/multi_vector_bench.py's torch runner):
MultiVectorSides.encode (tokenizing), forward_packed with the kept rows gathered on the device, and the answer
(vector_outputs), each timed alone over the same batches; beside them the same ids through the engine of a dense
export of the same shape (mean pooling), and the ColBERT engine with every row kept (no gather).

    python docs/results/h100/retrieval-2026-12-05-b/phases_probe.py --device cuda [--shape bert-base]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from export.__main__ import export
from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from model_repository.stages.multi_vector_output import MultiVectorSides, kept_counts, vector_outputs
from settings import ROOT, load_settings


def best_ms(call, batches, passes: int, cuda: bool) -> float:
    for batch in batches:
        call(batch)
    times = []
    for _ in range(passes):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        for batch in batches:
            call(batch)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / len(batches))
    return min(times) * 1e3


def phase_times(sides, colbert, dense, batches, encoded, rows, counts, passes: int, cuda: bool) -> dict[str, float]:
    def timed(call, items) -> float:
        return best_ms(call, items, passes, cuda)

    return {
        "whole (bench call)": timed(lambda b: sides.vectors(colbert, b, "document"), batches),
        "tokenize": timed(lambda b: sides.encode(b, "document"), batches),
        "engine, kept gathered": timed(lambda e: colbert.forward_packed(e[0], e[1], e[2], kept=e[3]), encoded),
        "engine, every row": timed(lambda e: colbert.forward_packed(e[0], e[1], e[2]), encoded),
        "dense engine, same ids": timed(lambda e: dense.forward_packed(e[0], e[1]), encoded),
        "answer": timed(lambda i: vector_outputs(rows[i], counts[i], ()), range(len(rows))),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch", default="64,256")
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    settings = load_settings(ROOT / "settings" / "variants" / "colbert.toml")
    options = {"precision": "fp16" if cuda else "fp32", "threads": torch.get_num_threads(), **settings.engine.options}
    texts = [text for text in load_text() if text.strip()][: args.texts]
    tokenizer = ROOT / ".kit" / "tokenizer.json"
    with tempfile.TemporaryDirectory() as work:
        folders = {task: Path(work) / task for task in ("multi_vector", "embedding")}
        for task, folder in folders.items():
            export(
                f"random-init:{args.shape}",
                task,
                settings.model.max_tokens,
                folder,
                settings.engine.onnx_opset,
                settings.engine.onnx_tolerance,
                tokenizer if tokenizer.exists() else None,
                onnx=False,
            )
        sides = MultiVectorSides(
            folders["multi_vector"] / "tokenizer.json",
            json.loads((folders["multi_vector"] / "serving.json").read_text())["multi_vector"],
        )
        colbert = load_engine("torch", folders["multi_vector"], args.device, options)
        dense = load_engine("torch", folders["embedding"], args.device, options)
        for size in map(int, args.batch.split(",")):
            batches = [texts[i : i + size] for i in range(0, len(texts), size)]
            encoded = [sides.encode(batch, "document") for batch in batches]
            kept_sum = sum(int(e[3].sum()) for e in encoded)
            rows = [colbert.forward_packed(ids, lengths, types, kept=kept) for ids, lengths, types, kept in encoded]
            counts = [kept_counts(lengths, kept) for _, lengths, _, kept in encoded]
            phases = phase_times(sides, colbert, dense, batches, encoded, rows, counts, args.passes, cuda)
            tokens = sum(len(e[0]) for e in encoded) / len(encoded)
            print(f"batch {size}: {tokens:.0f} tokens, {kept_sum / len(encoded):.0f} kept a batch")
            for name, ms in phases.items():
                print(f"  {name:<24} {ms:8.3f} ms  {size / ms * 1e3:10,.0f} texts/s")


if __name__ == "__main__":
    main()
