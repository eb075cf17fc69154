"""Task sparse (SPLADE): the sparse engines at each precision against sentence-transformers' SparseEncoder at fp32 on
the same texts, in one process: throughput, memory, and whether each text's terms are the reference's.

    python -m bench.sparse_bench --device cpu|cuda --out DIR [--shape bert-base|... | --checkpoint FOLDER]
                                 [--batch 32] [--texts 1024] [--passes 3] [--threads N] [--tokenizer FILE]

Model: random weights of the preset's real shape and vocabulary (30,522), exported by the project's export as
settings/variants/splade.toml's random-init source is (its decoder bias lowered so that texts stay sparse); or
--checkpoint, a SparseEncoder folder (the tests' tiny one: tests/checkpoints.py make_sparse_checkpoint). Texts:
loadtest/corpus.txt, tokenized once by the export's tokenizer for the engines, which take token ids as the stage
feeds them (tokenizer_texts_per_s: what that costs); SparseEncoder tokenizes inside encode().
Runners, each called once per batch of --batch texts: SparseEncoder at fp32 (the reference; on CUDA also at fp16,
the speed baseline of earlier records), then the engines at each precision of RUNNERS, loaded as the stage loads
them. Per runner and batch size: texts/s of the best of --passes timed passes after an untimed one; the peak memory
during the timed passes over what the runner held once loaded (`memory` says how it was measured); `agreement` of
every text of the untimed pass with the reference (`top_terms`). `default`: what engine.kind/precision "auto" serve
for task sparse on this machine (common/engine_choice.py). `rounding_floors`: the reference with only its max logits
rounded to fp16 / bf16, what storing the decoder's logits in that dtype (a GPU's fp16/bf16 engine) does by itself.
With several --batch sizes, SparseEncoder's row of each later size holds its agreement with the first size's
reference: how far fp32 rounding alone (other padding, other GEMM shapes) moves the reference.
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
from bench.reference_run import PeakGrowth, add_run_arguments, batch_sizes, measure, run_record, split
from common.contract import ServingSpec
from common.engine_choice import choose_engine
from common.hf_tokenizer import load_tokenizer
from export.__main__ import export
from export.sparse_export import SPARSE_FAMILIES
from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.models import presets
from settings import ROOT, load_settings

SETTINGS = ROOT / "settings" / "variants" / "splade.toml"
# Two fp32 weights this close are a tie: fp32 rounding alone orders them either way (2026-12-04: SparseEncoder at
# batch 8 against itself at 32 swapped pairs up to 9.4e-7 apart, the fp32 engines against it up to 1.3e-6), and a
# weight this small is a logit within rounding of 0, on either side of the relu.
TIE = 1e-5
TOP_SHARE = 0.01  # the bar's terms: those above 1 % of the vector's largest weight
# name -> (engine kind, options over the settings' [engine] ones), per device. On CUDA torch_fp32_sdpa beside
# torch_fp32: the Triton attention kernel's fp32 tl.dot runs TF32 by Triton's default, which moved the terms when
# emulated on the CPU (docs/results/cpu-2026-12-04/sparse-precision).
RUNNERS = {
    "cpu": {
        "torch_bf16": ("torch", {"precision": "bf16"}),
        "torch_fp32": ("torch", {"precision": "fp32"}),
        "onnxruntime_cpu": ("onnxruntime_cpu", {"precision": "fp32"}),
    },
    "cuda": {
        "torch_fp16": ("torch", {"precision": "fp16"}),
        "torch_fp32": ("torch", {"precision": "fp32"}),
        "torch_fp32_sdpa": ("torch", {"precision": "fp32", "attention": "sdpa"}),
    },
}
REFERENCE = "sentence_transformers"  # SparseEncoder at fp32


def top_terms(served: np.ndarray, reference: np.ndarray) -> dict:
    """Per text, [texts, vocabulary] against the reference: whether the terms above TOP_SHARE of the vector's max
    are the reference's, as a set and in order of weight, strictly and beyond ties (TIE); a term of one set only
    is a tie when the reference weighs it within TIE of its cut, a pair the served side does not order as the
    reference does (the reference orders them, the served side ties or swaps them) when the reference weighs them
    within TIE of each other. Kendall's tau-a of the served weights of the reference's terms, the Jaccard index of
    the non-zero sets, the largest weight difference, the cosine."""
    texts = len(reference)
    set_strict = set_beyond = order_strict = order_beyond = 0
    taus, jaccards, terms, worst_gap = [], [], [], 0.0
    for row, expected in zip(served, reference, strict=True):
        nonzero, expected_nonzero = row > 0, expected > 0
        jaccards.append((nonzero & expected_nonzero).sum() / max((nonzero | expected_nonzero).sum(), 1))
        cut = TOP_SHARE * expected.max()
        mine, theirs = set(np.flatnonzero(row > TOP_SHARE * row.max())), set(np.flatnonzero(expected > cut))
        set_strict += mine != theirs
        set_beyond += any(abs(expected[term] - cut) > TIE for term in mine ^ theirs)
        top = np.flatnonzero(expected > cut)
        terms.append(len(top))
        weights, expected_weights = row[top], expected[top]
        apart = expected_weights[:, None] - expected_weights[None, :]  # [i, j] > 0: the reference puts i before j
        served_apart = weights[:, None] - weights[None, :]
        misordered = (apart > 0) & (served_apart <= 0)  # a served tie leaves the pair unordered
        if misordered.any():
            worst_gap = max(worst_gap, float(apart[misordered].max()))
        order_strict += bool(misordered.any())
        order_beyond += bool((misordered & (apart > TIE)).any())
        pairs = len(top) * (len(top) - 1) // 2
        concordant = ((apart > 0) & (served_apart > 0)).sum() - ((apart > 0) & (served_apart < 0)).sum()
        taus.append(1.0 if pairs == 0 else float(concordant) / pairs)
    cosine = (served * reference).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))
    return {
        "texts": texts,
        "top_terms_per_text": float(np.mean(terms)),
        "texts_top_set_differs": int(set_strict),
        "texts_top_set_differs_beyond_ties": int(set_beyond),
        "texts_top_order_differs": int(order_strict),
        "texts_top_order_differs_beyond_ties": int(order_beyond),
        "largest_misordered_gap": worst_gap,
        "kendall_tau_min": float(min(taus)),
        "jaccard_nonzero_min": float(min(jaccards)),
        "jaccard_nonzero_mean": float(np.mean(jaccards)),
        "max_abs_diff": float(np.abs(served - reference).max()),
        "cosine_min": float(cosine.min()),
        "holds_bar": set_beyond == 0 and order_beyond == 0,
    }


def logits_rounded(reference: np.ndarray, activation: str, dtype: torch.dtype) -> np.ndarray:
    """The reference as if its max logits had been stored in `dtype`: the activation undone, the logit rounded, the
    activation redone (rounding is monotonic: the max of rounded logits is the rounded max)."""
    twice = activation == "log1p_relu"
    logits = np.expm1(np.expm1(reference) if twice else reference)
    rounded = torch.from_numpy(logits).to(dtype).float().numpy()
    return np.log1p(np.log1p(rounded) if twice else rounded)


def sparse_encoder(folder: Path, activation: str, max_tokens: int, device: str, half: bool):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    mlm = Transformer(str(folder), transformer_task="fill-mask", max_seq_length=max_tokens)
    model = SparseEncoder(modules=[mlm, SpladePooling("max", activation)], device=device)
    return model.half() if half else model


def dense_rows(outputs: list, name: str, vocabulary: int) -> np.ndarray:
    """Every text's weights, [texts, vocabulary] fp32: SparseEncoder's sparse tensors, or the engines' rows."""
    if name.startswith(REFERENCE):
        return np.concatenate([batch.to_dense().float().cpu().numpy() for batch in outputs])
    rows = [row for batch in outputs for row in batch]
    out = np.zeros((len(rows), vocabulary), dtype=np.float32)
    for weights, row in zip(out, rows, strict=True):
        weights[row.indices] = row.values
    return out


def keeping(call, outputs: list, count: int):
    """`call`, its first `count` outputs (measure's untimed pass over every batch) appended to `outputs`."""

    def kept(batch):
        out = call(batch)
        if len(outputs) < count:
            outputs.append(out)
        return out

    return kept


def main(argv: list[str] | None = None) -> int:
    import sentence_transformers

    shapes = [name for name, fields in presets().items() if fields["model_type"] in SPARSE_FAMILIES]
    parser = argparse.ArgumentParser(prog="python -m bench.sparse_bench", description=__doc__)
    add_run_arguments(parser, None)
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--shape", choices=shapes, default="bert-base")
    model.add_argument("--checkpoint", type=Path, help="a SparseEncoder folder instead of a random-init shape")
    args = parser.parse_args(argv)
    sizes = batch_sizes(args)
    settings = load_settings(SETTINGS)
    torch.set_num_threads(args.threads)  # SparseEncoder's; the engines set theirs from the options
    texts = [text for text in load_text() if text.strip()][: args.texts]
    memory = PeakGrowth(args.device)
    record = run_record("sparse_bench", argv, args, memory)
    del record["precision"]  # each runner's own: RUNNERS
    source = str(args.checkpoint) if args.checkpoint else f"random-init:{args.shape}"
    default = choose_engine("auto", "auto", args.device == "cuda", "sparse")
    record |= {"sentence_transformers": sentence_transformers.__version__, "source": source}
    record |= {"default": default.describe(), "tie": TIE, "top_share": TOP_SHARE}
    max_tokens = settings.model.max_tokens
    with tempfile.TemporaryDirectory(prefix="sparse_bench_") as work:
        folder = Path(work) / "export"
        engine = settings.engine
        report = export(source, "sparse", max_tokens, folder, engine.onnx_opset, engine.onnx_tolerance, args.tokenizer,
                        onnx=args.device == "cpu")  # fmt: skip
        spec = ServingSpec.load(folder)
        tokenizer = load_tokenizer(folder / "tokenizer.json", max_tokens)
        started = time.perf_counter()
        sequences = [np.array(encoding.ids, np.int32) for encoding in tokenizer.encode_batch(texts)]
        most = {size: max(sum(map(len, batch)) for batch in split(sequences, size)) for size in sizes}  # tokens
        record |= {
            "export_s": report["seconds"],
            "activation": spec.activation,
            "vocabulary": spec.output_size,
            "texts": len(texts),
            "mean_tokens": sum(map(len, sequences)) / len(sequences),
            "tokenizer_texts_per_s": len(texts) / (time.perf_counter() - started),
            "batches": {str(size): {"full_logits_bytes": 4 * spec.output_size * most[size]} for size in sizes},
        }
        reference = {}
        builds = {REFERENCE: partial(sparse_encoder, folder, spec.activation, max_tokens, args.device, False)}
        if args.device == "cuda":
            builds[REFERENCE + "_fp16"] = partial(sparse_encoder, folder, spec.activation, max_tokens, "cuda", True)
        for name, (kind, options) in RUNNERS[args.device].items():
            engine_options = {"threads": args.threads, **settings.engine.options, **options}
            builds[name] = partial(load_engine, kind, folder, args.device, engine_options)
        for name, build in builds.items():
            runner = build()
            memory.loaded()
            for size in sizes:
                if name.startswith(REFERENCE):
                    call, feed = partial(runner.encode, batch_size=size, show_progress_bar=False), texts
                else:
                    call, feed = runner.forward, sequences
                batches, outputs = split(feed, size), []
                _, row = measure(keeping(call, outputs, len(batches)), batches, args.passes, memory)
                weights = dense_rows(outputs, name, spec.output_size)
                if name == REFERENCE:
                    reference[size] = weights
                    row["nonzero_per_text"] = float((weights > 0).sum(1).mean())
                    if size != sizes[0]:
                        row["agreement"] = top_terms(weights, reference[sizes[0]])
                else:
                    row["agreement"] = top_terms(weights, reference[size])
                record["batches"][str(size)][name] = row
            del runner, call
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    floors = {"fp16": torch.float16, "bf16": torch.bfloat16}
    record["rounding_floors"] = {
        f"logits_{name}": top_terms(logits_rounded(reference[sizes[0]], spec.activation, dtype), reference[sizes[0]])
        for name, dtype in floors.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    print_table(record)
    return 0


def print_table(record: dict) -> None:
    print(f"default here: {record['default']}")
    head = f"{'batch':>5} {'runner':<26} {'texts/s':>9} {'vs ST':>6} {'peak MiB':>9} {'max diff':>9} {'cos min':>10}"
    print(head + f" {'set !=':>7} {'order !=':>8} {'tau min':>8} {'bar':>4}")
    for size, runs in record["batches"].items():
        base = runs[REFERENCE]["texts_per_s"]
        for name, row in runs.items():
            if name == "full_logits_bytes":
                continue
            rate = row["texts_per_s"]
            cells = f"{rate:>9.1f} {rate / base:>5.2f}x {row['peak_growth_bytes'] / 2**20:>9.1f}"
            print(f"{size:>5} {name:<26} {cells} {agreement_cells(row.get('agreement'))}")
        print(f"{size:>5} (whole fp32 logits of the largest batch: {runs['full_logits_bytes'] / 2**20:.0f} MiB)")
    for name, check in record["rounding_floors"].items():
        print(f"{'':>5} {'reference, ' + name:<26} {'':>9} {'':>6} {'':>9} {agreement_cells(check)}")


def agreement_cells(check: dict | None) -> str:
    """max diff, cosine, texts whose top terms differ (set, order) beyond ties, Kendall's tau, the bar held."""
    if check is None:
        return f"{'-':>9} {'-':>10} {'-':>7} {'-':>8} {'-':>8} {'-':>4}"
    differ = f"{check['texts_top_set_differs_beyond_ties']:>7} {check['texts_top_order_differs_beyond_ties']:>8}"
    held = "yes" if check["holds_bar"] else "no"
    close = f"{check['max_abs_diff']:>9.2e} {check['cosine_min']:>10.7f}"
    return f"{close} {differ} {check['kendall_tau_min']:>8.5f} {held:>4}"


if __name__ == "__main__":
    raise SystemExit(main())
