"""Task hybrid (BGE-M3): its outputs against the dense vector alone, on the same weights, in one process.

    python -m bench.hybrid_bench --device cpu|cuda --out DIR [--preset bge-m3] [--batch 64,1] [--texts 1024]
                                 [--passes 3] [--threads N] [--tokenizer FILE]

Model: random weights and heads of the preset's real shape (bge-m3: XLM-RoBERTa-large, 250,002 ids), exported as
task hybrid by the project's export (settings/variants/bge-m3.toml's source), and the same export served as task
embedding (its serving.json rewritten: the first token's vector, normalized, the hybrid's dense output). Texts:
loadtest/corpus.txt, tokenized once by the export's tokenizer. Runners, each called once per batch of --batch
texts, on the torch engine (fp16 on CUDA, fp32 on the CPU) as the stage loads it:
  dense          the embedding export: one vector per text;
  dense+sparse   the hybrid export, and per batch the stage's answer of the dense vectors and lexical weights to one
                 request of its texts (hybrid_output.py: lexical maximum per token id; no colbert vector copied);
  all            the same with the colbert vectors too (every token's but the first, packed fp16 on a GPU);
  all-engine     the hybrid engine alone, all three copied out, no answer built (where all's time goes).
Per runner and batch size: texts/s of the best of --passes timed passes after an untimed one, and the peak memory
during them over what the runner held once loaded; each hybrid runner against dense (issue 34's bar for all three:
>= 0.8). agreement: the
engine's three outputs of the first batch against the export's fp32 PyTorch reference (HybridStates, each text
alone) on the same device: the dense and colbert vectors' least cosine, the token weights' largest difference.
Writes DIR/hybrid_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.record import write
from bench.reference_run import PeakGrowth, add_run_arguments, batch_sizes, measure, run_record, split
from common.contract import HYBRID_HEADS_FILE, SPARSE_INDICES, SPARSE_VALUES, TOKEN_COUNTS, TOKEN_VECTORS, ServingSpec
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.hybrid_output import HybridOutput
from settings import ROOT, load_settings

SETTINGS = ROOT / "settings" / "variants" / "bge-m3.toml"
CALIBRATION_TEXTS = 64  # the export's int8 calibration, on the CPU: a few texts keep a large preset's export short
# What each hybrid runner's request asks for (None: the engine alone, every output copied out).
ASKED = {
    "dense+sparse": ("embedding", SPARSE_INDICES, SPARSE_VALUES),
    "all": ("embedding", SPARSE_INDICES, SPARSE_VALUES, TOKEN_VECTORS, TOKEN_COUNTS),
    "all-engine": None,
}
RUNNERS = ("dense", *ASKED)


@dataclasses.dataclass(frozen=True)
class Asking:
    """A request as the stage reads it: the outputs it names, the settings' sparse cut."""

    names: tuple[str, ...]

    def requested_output_names(self) -> list[str]:
        return list(self.names)

    def parameters(self) -> str:
        return ""


def dense_export(folder: Path, out: Path) -> None:
    """The hybrid export as an embedder of its dense output: the same weights, serving.json's task embedding."""
    shutil.copytree(folder, out)
    spec = ServingSpec.load(folder)
    dataclasses.replace(spec, task="embedding", multi_vector=None, hybrid=None).save(out)


def runner(name: str, engine, spec: ServingSpec, settings):
    """The call a batch of token sequences gets."""
    if name == "dense" or ASKED[name] is None:
        return engine.forward
    answer = HybridOutput({"sparse_top_k": settings.sparse.top_k, "sparse_threshold": settings.sparse.threshold},
                          spec.hybrid)  # fmt: skip
    request = Asking(ASKED[name])
    wanted = answer.wanted([request])

    def hybrid(sequences: list[np.ndarray]) -> dict:
        ids, lengths = pack_sequences(sequences)
        rows = engine.forward_packed(ids, lengths, None, wanted)
        return answer.tensors(rows, ids, lengths, slice(0, len(lengths)), slice(0, len(ids)), request)

    return hybrid


@torch.inference_mode()
def agreement(folder: Path, sequences: list[np.ndarray], rows, device: str) -> dict:
    """The engine's HybridRows of sequences against HybridStates in fp32, each sequence alone."""
    from export.checkpoint import load_model, open_checkpoint
    from export.hybrid_export import HybridHeads, HybridStates

    with np.load(folder / HYBRID_HEADS_FILE) as heads:
        parts = HybridHeads(
            (heads["sparse_weight"], heads["sparse_bias"]), (heads["colbert_weight"], heads["colbert_bias"])
        )
    reference = HybridStates(load_model(open_checkpoint(str(folder)), "hybrid"), parts).to(device)
    dense, weights, vectors = [], [], []
    for sequence in sequences:
        ids = torch.from_numpy(sequence[None]).to(device)
        outputs = reference(ids, torch.ones_like(ids))
        for found, output in zip((dense, weights, vectors), outputs, strict=True):
            found.append(output[0].float().cpu().numpy())
        vectors[-1] = vectors[-1][1:]  # the engines give no colbert vector of a text's first token
    dense, weights, vectors = np.stack(dense), np.concatenate(weights), np.concatenate(vectors)

    def least_cosine(a: np.ndarray, b: np.ndarray) -> float:
        return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())

    return {
        "texts": len(sequences),
        "dense_min_cosine": least_cosine(rows.dense, dense),
        "colbert_min_cosine": least_cosine(rows.vectors.astype(np.float32), vectors),
        "weights_max_abs_diff": float(np.abs(rows.weights - weights).max()),
        "weights_largest": float(weights.max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hybrid_bench", description=__doc__)
    add_run_arguments(parser, "64,1")
    parser.add_argument("--preset", default="bge-m3", help="random-init preset (tests: a tiny XLM-RoBERTa)")
    args = parser.parse_args(argv)
    sizes = batch_sizes(args)
    settings = load_settings(SETTINGS)
    texts = [text for text in load_text() if text.strip()][: args.texts]
    memory = PeakGrowth(args.device)
    record = run_record("hybrid_bench", argv, args, memory)
    record |= {"preset": args.preset, "batches": {str(size): {} for size in sizes}}
    max_tokens, precision = settings.model.max_tokens, record["precision"]
    with tempfile.TemporaryDirectory(prefix="hybrid_bench_") as work:
        folder, corpus = Path(work) / "hybrid", Path(work) / "calibration.txt"
        corpus.write_text("\n".join(texts[:CALIBRATION_TEXTS]) + "\n")  # its ranges are not what is measured
        onnx = settings.engine
        report = export(f"random-init:{args.preset}", "hybrid", max_tokens, folder, onnx.onnx_opset,
                        onnx.onnx_tolerance, args.tokenizer, onnx=False, calibration_corpus=corpus)  # fmt: skip
        dense_export(folder, Path(work) / "dense")
        tokenizer = load_tokenizer(folder / "tokenizer.json", max_tokens)
        sequences = [np.array(encoding.ids, np.int32) for encoding in tokenizer.encode_batch(texts)]
        record |= {
            "export_s": report["seconds"],
            "texts": len(texts),
            "mean_tokens": float(np.mean(list(map(len, sequences)))),
        }
        options = {"precision": precision, "threads": args.threads, **settings.engine.options}
        for folder_name in ("dense", "hybrid"):
            export_dir = Path(work) / folder_name
            engine = load_engine("torch", export_dir, args.device, options)
            memory.loaded()
            if folder_name == "hybrid":
                first = sequences[: sizes[0]]
                rows = engine.forward_packed(*pack_sequences(first))
                record["agreement"] = agreement(export_dir, first, rows, args.device)
            for name in ("dense",) if folder_name == "dense" else ASKED:
                call = runner(name, engine, ServingSpec.load(export_dir), settings)
                for size in sizes:
                    started = time.perf_counter()
                    _, row = measure(call, split(sequences, size), args.passes, memory)
                    row["wall_s"] = time.perf_counter() - started
                    record["batches"][str(size)][name] = row
            del engine, call
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    for runs in record["batches"].values():
        runs["vs_dense"] = {name: runs[name]["texts_per_s"] / runs["dense"]["texts_per_s"] for name in ASKED}
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    print(f"{'batch':>5} {'runner':<13} {'texts/s':>10} {'vs dense':>8} {'peak MiB':>9}")
    for size, runs in record["batches"].items():
        for name in RUNNERS:
            row, ratio = runs[name], runs["vs_dense"].get(name, 1.0)
            cells = f"{row['texts_per_s']:>10.1f} {ratio:>7.3f}x {row['peak_growth_bytes'] / 2**20:>9.1f}"
            print(f"{size:>5} {name:<13} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
