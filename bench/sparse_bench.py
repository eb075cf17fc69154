"""Task sparse (SPLADE): the sparse engines against sentence-transformers' SparseEncoder.encode on the same texts,
in one process.

    python -m bench.sparse_bench --device cpu|cuda --out DIR [--shape bert-base|distilbert-base] [--batch 32]
                                 [--texts 1024] [--passes 3] [--threads N] [--tokenizer FILE]

Model: random weights of the preset's real shape and vocabulary (30,522), exported by the project's export as
settings/variants/splade.toml's random-init source is (its decoder bias lowered so that texts stay sparse). Texts:
loadtest/corpus.txt, tokenized once by the export's tokenizer for the engines, which take token ids as the stage
feeds them (tokenizer_texts_per_s: what that costs); SparseEncoder tokenizes inside encode().
Runners, each called once per batch of --batch texts: SparseEncoder (fp32 on the CPU, fp16 on CUDA), the torch
engine (the same precisions) and onnxruntime_cpu (CPU only), the engines loaded as the stage loads them.
Per runner and batch size: texts/s of the best of --passes timed passes after an untimed one; the peak memory during
the timed passes over what the runner held once loaded (`memory` says how it was measured); against SparseEncoder
on the first batch, the largest weight difference and how many texts keep the same entries above 1e-5.
full_logits_bytes: the largest batch's whole [tokens x vocabulary] logits in fp32, which the engines never hold.
Writes DIR/sparse_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.record import write
from bench.reference_run import (
    PeakGrowth,
    add_run_arguments,
    batch_sizes,
    load_runner,
    measure,
    run_record,
    runner_names,
    split,
)
from common.contract import ServingSpec
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from export.sparse_export import SPARSE_FAMILIES
from loadtest.corpus import load_text
from model_repository.stages.engines.models import presets
from settings import ROOT, load_settings

SETTINGS = ROOT / "settings" / "variants" / "splade.toml"
THRESHOLD = 1e-5  # a weight this small is a logit within rounding of 0: either side of the relu is right


def agreement(rows: list, reference: np.ndarray) -> dict:
    served = np.zeros_like(reference)
    for dense, row in zip(served, rows, strict=True):
        dense[row.indices] = row.values
    same = ((served > THRESHOLD) == (reference > THRESHOLD)).all(axis=1)
    return {"max_abs_diff": float(np.abs(served - reference).max()), "same_entries": f"{int(same.sum())}/{len(same)}"}


def sparse_encoder(folder: Path, activation: str, max_tokens: int, device: str):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    mlm = Transformer(str(folder), transformer_task="fill-mask", max_seq_length=max_tokens)
    model = SparseEncoder(modules=[mlm, SpladePooling("max", activation)], device=device)
    return model.half() if device == "cuda" else model


def main(argv: list[str] | None = None) -> int:
    import sentence_transformers

    shapes = [name for name, fields in presets().items() if fields["model_type"] in SPARSE_FAMILIES]
    parser = argparse.ArgumentParser(prog="python -m bench.sparse_bench", description=__doc__)
    add_run_arguments(parser, None)
    parser.add_argument("--shape", choices=shapes, default="bert-base")
    args = parser.parse_args(argv)
    sizes = batch_sizes(args)
    settings = load_settings(SETTINGS)
    torch.set_num_threads(args.threads)  # SparseEncoder's; the engines set theirs from the options
    texts = [text for text in load_text() if text.strip()][: args.texts]
    memory = PeakGrowth(args.device)
    record = run_record("sparse_bench", argv, args, memory)
    record |= {"sentence_transformers": sentence_transformers.__version__, "shape": args.shape}
    max_tokens, precision = settings.model.max_tokens, record["precision"]
    with tempfile.TemporaryDirectory(prefix="sparse_bench_") as work:
        folder = Path(work) / "export"
        report = export(f"random-init:{args.shape}", "sparse", max_tokens, folder, settings.engine.onnx_opset,
                        settings.engine.onnx_tolerance, args.tokenizer, onnx=args.device == "cpu")  # fmt: skip
        spec = ServingSpec.load(folder)
        tokenizer = load_tokenizer(folder / "tokenizer.json", max_tokens)
        started = time.perf_counter()
        sequences = [np.array(encoding.ids, np.int32) for encoding in tokenizer.encode_batch(texts)]
        most = {size: max(sum(map(len, batch)) for batch in split(sequences, size)) for size in sizes}  # tokens
        record |= {
            "export_s": report["seconds"],
            "vocabulary": spec.output_size,
            "texts": len(texts),
            "mean_tokens": sum(map(len, sequences)) / len(sequences),
            "tokenizer_texts_per_s": len(texts) / (time.perf_counter() - started),
            "batches": {str(size): {"full_logits_bytes": 4 * spec.output_size * most[size]} for size in sizes},
        }
        reference = {}
        options = {"precision": precision, "threads": args.threads, **settings.engine.options}
        for name in runner_names(args.device):
            build = partial(sparse_encoder, folder, spec.activation, max_tokens, args.device)
            model = load_runner(name, build, folder, args.device, options)
            memory.loaded()
            for size in sizes:
                if name == "sentence_transformers":
                    call, feed = partial(model.encode, batch_size=size, show_progress_bar=False), texts
                else:
                    call, feed = model.forward, sequences
                first, row = measure(call, split(feed, size), args.passes, memory)
                if name == "sentence_transformers":
                    reference[size] = first.to_dense().float().cpu().numpy()
                    row["nonzero_per_text"] = float((reference[size] > 0).sum(1).mean())
                else:
                    row["agreement"] = agreement(first, reference[size])
                record["batches"][str(size)][name] = row
            del model, call
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    print_table(record)
    return 0


def print_table(record: dict) -> None:
    print(f"{'batch':>5} {'runner':<22} {'texts/s':>9} {'vs ST':>6} {'peak MiB':>9} {'max diff':>9} {'same':>9}")
    for size, runs in record["batches"].items():
        base = runs["sentence_transformers"]["texts_per_s"]
        for name, row in runs.items():
            if name == "full_logits_bytes":
                continue
            rate, check = row["texts_per_s"], row.get("agreement", {"max_abs_diff": float("nan"), "same_entries": "-"})
            cells = f"{rate:>9.1f} {rate / base:>5.2f}x {row['peak_growth_bytes'] / 2**20:>9.1f}"
            print(f"{size:>5} {name:<22} {cells} {check['max_abs_diff']:>9.2e} {check['same_entries']:>9}")
        print(f"{size:>5} (whole fp32 logits of the largest batch: {runs['full_logits_bytes'] / 2**20:.0f} MiB)")


if __name__ == "__main__":
    raise SystemExit(main())
