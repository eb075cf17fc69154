"""python -m bench.perf_check (`make perf-check`): a speed regression guard that holds on a noisy machine.

What it measures is a ratio taken in one run on one machine, so that the machine's own speed cancels. On the
CPU (the default): the served default model (the real tritonserver, the lean gRPC client of
bench/cpu_throughput.py) against sentence-transformers encode() on the same texts, sentence-transformers
timed before and after the server and averaged. With --gpu (on a GPU machine, settings with encoder.gpus;
default settings/variants/bert-base-h200.toml): the served path (perf_analyzer over gRPC, one text
per request) against the engine alone on the same GPU (packed ids in, embeddings out, batch --engine-batch),
the engine timed before and after the server's rounds. Each load shape's ratio is compared with the baseline
recorded for this kind of machine in docs/results/perf-baseline/ (cpu-<engine>-<precision>.json, for the engine
that "auto" picks on this CPU; gpu-<GPU name>.json); the check fails when a ratio is more than --margin (20 %)
below its baseline, printing both. `--update` measures and
writes the baseline instead (do it on a quiet machine of the kind CI runs on, after a change that is meant
to move the numbers, and commit it).

Why 20 %: each round's ratio scatters by up to +-20 % on a shared 2-core machine, so the check takes the
median of 7 rounds; three such runs one after the other gave medians within 2 % (1x32) and 8 % (8x8) of each
other (the baseline file holds all three). A regression worth stopping is larger (ORT on one thread instead
of two: 1.31x -> 0.82x, caught; docs/results/perf-baseline/), and 20 % stays clear of the spread. The engine is
part of the machine's kind: "auto" serves torch bf16 where the CPU multiplies bf16 (Zen 4: 2.2x) and ONNX Runtime
fp32 elsewhere (Zen 3: 1.37x), and both CPUs call themselves "AMD EPYC". On a CPU other than the baseline's the
margin is 40 % (margin_for): the ratio itself depends on the CPU. On a GPU the
rounds run on one server: their spread is in the baseline file beside the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.e2e_bench import parse_shapes
from loadtest.corpus import load_text
from model_repository.generate import generate
from serving.launcher.harness import local_server
from settings import ROOT, load_settings

BASELINES = ROOT / "docs" / "results" / "perf-baseline"
GPU_SETTINGS = ROOT / "settings" / "variants" / "bert-base-h200.toml"
OTHER_MACHINE_MARGIN = 0.4


def interleaved(loads: dict, served, reference, rounds: int, first_reference: float) -> dict:
    """Per shape, the median over rounds of served(*load) / reference(): the reference timed once before the
    first round (first_reference) and after each, and each round held to the mean of the two around it."""
    references = [first_reference]
    ratios: dict[str, list[float]] = {shape: [] for shape in loads}
    rates: dict[str, list[float]] = {shape: [] for shape in loads}
    for _ in range(rounds):
        round_rates = {shape: served(*load) for shape, load in loads.items()}
        references.append(reference())
        for shape, rate in round_rates.items():
            rates[shape].append(round(rate, 1))
            ratios[shape].append(rate / ((references[-2] + references[-1]) / 2))
    return {
        "ratios": {shape: round(statistics.median(values), 3) for shape, values in ratios.items()},
        "round_ratios": {shape: [round(v, 3) for v in values] for shape, values in ratios.items()},
        "served": rates,
        "references": [round(rate, 1) for rate in references],
    }


def measure(settings_path: str | None, overrides: list[str], texts: list[str], shapes: list[str], rounds: int) -> dict:
    """Per shape, the median over rounds of ensemble texts/s / sentence-transformers texts/s, where each round
    times sentence-transformers, then each shape, then sentence-transformers again (both sides drift on a
    shared machine, and a round's ratio only compares what ran side by side)."""
    from bench.cpu_throughput import encode_rate, ensemble_rate, sentence_transformer  # transformers: CPU only

    settings = load_settings(settings_path, overrides)
    model = sentence_transformer(settings, texts, 32)
    work_dir = settings.build_dir / "perf_check"
    repository = generate(settings, settings.export_dir, work_dir / "repository")
    loads = dict(zip(shapes, parse_shapes(",".join(shapes)), strict=True))  # "1x32" -> (1, 32)
    with local_server(settings, repository, work_dir) as server:

        def served(per_request: int, concurrency: int) -> float:
            return asyncio.run(ensemble_rate(server.grpc_url, texts, per_request, concurrency))[0]

        for per_request, concurrency in loads.values():  # warm-up
            asyncio.run(ensemble_rate(server.grpc_url, texts[:64], per_request, concurrency))

        def reference() -> float:
            return encode_rate(model, texts, 32)[0]

        result = interleaved(loads, served, reference, rounds, reference())
    return {
        "ratios": result["ratios"],
        "round_ratios": result["round_ratios"],
        "ensemble_texts_per_s": result["served"],
        "sentence_transformers_texts_per_s": result["references"],
    }


def engine_batches(settings, texts: list[str], batch: int):
    """The settings' engine on encoder.gpus[0], and the texts tokenized once into batches of packed ids."""
    from bench.engine_workload import settings_engine
    from common.hf_tokenizer import load_tokenizer

    export = settings.export_dir
    tokenizer = load_tokenizer(export / "tokenizer.json", settings.max_tokens())
    ids = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(texts)]
    batches = [ids[i : i + batch] for i in range(0, len(ids) - batch + 1, batch)]
    return settings_engine(settings, f"cuda:{settings.encoder.gpus[0]}"), batches


def engine_rate(engine, batches) -> float:
    """Texts/s of the engine alone: packed ids in, embeddings out per batch, as the one-stage model calls it
    (copies and synchronization included)."""
    from bench.engine_workload import time_calls

    return time_calls(engine.forward, batches, min_calls=50, min_seconds=3.0)["seq_per_s"]


def measure_gpu(settings_path, overrides: list[str], texts: list[str], shapes: list[str], rounds: int, args) -> dict:
    """Per shape, the median over rounds of served texts/s / engine-alone texts/s, the engine timed before the
    first round and after each (the server idle meanwhile) and each round compared with the mean of its two."""
    from bench.e2e_bench import perf_analyzer_input, run_perf_analyzer

    settings = load_settings(settings_path or GPU_SETTINGS, overrides)
    if not settings.encoder.gpus:
        raise SystemExit("--gpu needs settings whose encoder runs on GPUs (encoder.gpus)")
    work_dir = settings.build_dir / "perf_check_gpu"
    repository = generate(settings, settings.export_dir, work_dir / "repository")
    data = work_dir / "texts.json"
    perf_analyzer_input(texts, data)
    loads = dict(zip(shapes, parse_shapes(",".join(shapes)), strict=True))
    engine, batches = engine_batches(settings, texts, args.engine_batch)  # kept: loading it again costs a capture
    first_reference = engine_rate(engine, batches)
    with local_server(settings, repository, work_dir) as server:

        def served(per_request: int, concurrency: int, interval_ms: int) -> float:
            csv_path = work_dir / "perf_analyzer.csv"
            result = run_perf_analyzer(
                args.perf_analyzer,
                server.grpc_url,
                "ensemble",
                data,
                concurrency,
                per_request,
                interval_ms,
                10,
                csv_path,
            )
            return result["inferences_per_s"]

        for per_request, concurrency in loads.values():  # warm-up
            served(per_request, concurrency, 1000)
        result = interleaved(
            loads,
            lambda per_request, concurrency: served(per_request, concurrency, args.interval_ms),
            lambda: engine_rate(engine, batches),
            rounds,
            first_reference,
        )
    return {
        "ratios": result["ratios"],
        "round_ratios": result["round_ratios"],
        "served_texts_per_s": result["served"],
        "engine_texts_per_s": result["references"],
        "engine_batch": args.engine_batch,
        "settings": str(settings.path.relative_to(ROOT)) if settings.path.is_relative_to(ROOT) else str(settings.path),
    }


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def margin_for(machine: dict, baseline_machine: dict, margin: float) -> float:
    """The margin, widened to OTHER_MACHINE_MARGIN on a machine of another kind than the baseline's: how fast
    the server runs next to sentence-transformers depends on the CPU (its vector units favour one or the other),
    so there only a gross regression counts."""
    keys = ("gpu",) if "gpu" in machine else ("cpu", "cores", "engine")
    same = all(machine.get(key) == baseline_machine.get(key) for key in keys)
    return margin if same else max(margin, OTHER_MACHINE_MARGIN)


def compare(measured: dict, baseline: dict, margin: float, reference: str = "sentence-transformers") -> list[str]:
    """One line per shape whose ratio (to `reference`) fell more than margin below the baseline's."""
    failures = []
    for shape, expected in baseline["ratios"].items():
        got = measured["ratios"].get(shape)
        if got is None or got < expected * (1 - margin):
            failures.append(f"{shape}: {got}x {reference}, baseline {expected}x (more than {margin:.0%} lower)")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf_check", description=__doc__)
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="settings override")
    parser.add_argument("--texts", type=int, help="texts per timed run (CPU 256, GPU 1024)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--shapes", help="TEXTS_PER_REQUESTxCONCURRENCY, comma separated (CPU 1x32,8x8; GPU 1x64,1x256)"
    )
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--baseline", type=Path, help="baseline file (default: this machine's kind's, above)")
    parser.add_argument("--update", action="store_true", help="measure three times and write the baseline")
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="where this run's JSON goes")
    gpu = parser.add_argument_group("--gpu: the served path against the engine alone, on a GPU machine")
    gpu.add_argument("--gpu", action="store_true")
    gpu.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    gpu.add_argument("--engine-batch", type=int, default=64)
    gpu.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer's measurement window")
    args = parser.parse_args(argv)
    if args.gpu:
        return check_gpu(args, argv)
    from bench import cpu_throughput

    texts, shapes = load_text()[: args.texts or 256], (args.shapes or "1x32,8x8").split(",")
    choice = load_settings(args.settings, args.set).engine_choice()
    runs = [measure(args.settings, args.set, texts, shapes, args.rounds) for _ in range(3 if args.update else 1)]
    measured = runs[0]
    if args.update:  # the baseline: per shape the median of three runs' medians, every run kept beside it
        shapes_seen = measured["ratios"]
        measured = {"ratios": {s: round(statistics.median(r["ratios"][s] for r in runs), 3) for s in shapes_seen}}
        measured["round_ratios"] = {s: [r["ratios"][s] for r in runs] for s in shapes_seen}
        measured["runs"] = runs
    record = {
        "benchmark": "perf_check",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu": cpu_throughput.cpu_name(), "cores": os.cpu_count(), "engine": choice.describe()},
        "command": "python -m bench.perf_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "texts": len(texts),
        "rounds": args.rounds,
        **measured,
    }
    baseline = args.baseline or BASELINES / f"cpu-{choice.kind}-{choice.precision}.json"
    return report(args, record, measured, "sentence-transformers", baseline)


def check_gpu(args, argv) -> int:
    """The GPU form: one server, --rounds rounds; --update writes that run as the baseline."""
    texts, shapes = load_text()[: args.texts or 1024], (args.shapes or "1x64,1x256").split(",")
    measured = measure_gpu(args.settings, args.set, texts, shapes, args.rounds, args)
    name = gpu_name()
    record = {
        "benchmark": "perf_check",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"gpu": name, "cores": os.cpu_count()},
        "command": "python -m bench.perf_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "texts": len(texts),
        "rounds": args.rounds,
        **measured,
    }
    baseline = args.baseline or BASELINES / f"gpu-{name.lower().replace(' ', '-')}.json"
    return report(args, record, measured, "the engine alone", baseline)


def report(args, record: dict, measured: dict, reference: str, baseline_path: Path) -> int:
    """Writes this run's JSON, prints each ratio; writes the baseline (--update) or compares with it."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "perf_check.json").write_text(json.dumps(record, indent=2) + "\n")
    for shape, ratio in measured["ratios"].items():
        print(f"{shape}: median {ratio}x {reference} of {measured['round_ratios'][shape]}")
    if args.update:
        baseline_path.parent.mkdir(parents=True, exist_ok=True)
        baseline_path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote the baseline {baseline_path}")
        return 0
    if not baseline_path.is_file():
        print(f"perf-check FAILED: no baseline {baseline_path}: measure one with --update", file=sys.stderr)
        return 1
    baseline = json.loads(baseline_path.read_text())
    margin = margin_for(record["machine"], baseline["machine"], args.margin)
    if margin != args.margin:
        cpu, known = record["machine"]["cpu"], baseline["machine"]["cpu"]
        print(f"no baseline for this CPU ({cpu}): held to that of {known} within {margin:.0%}")
    failures = compare(measured, baseline, margin, reference)
    for line in failures:
        print(f"perf-check FAILED {line}", file=sys.stderr)
    if not failures:
        print(f"perf-check passed: every ratio within {margin:.0%} of {baseline_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
