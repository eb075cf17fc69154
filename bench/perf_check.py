"""python -m bench.perf_check (`make perf-check`): a speed regression guard that holds on a noisy machine.

What it measures is a ratio taken in one run on one machine, so that the machine's own speed cancels: the
served default model (the real tritonserver, the lean gRPC client of bench/cpu_throughput.py) against
sentence-transformers encode() on the same texts, sentence-transformers timed before and after the server
and averaged. Each load shape's ratio is compared with the baseline recorded for this kind of machine in
bench/results/perf-baseline/cpu.json; the check fails when a ratio is more than --margin (20 %) below its
baseline, printing both. `--update` measures and writes the baseline instead (do it on a quiet machine of
the kind CI runs on, after a change that is meant to move the numbers, and commit it).

Why 20 %: each round's ratio scatters by up to +-20 % on a shared 2-core machine, so the check takes the
median of 7 rounds; three such runs one after the other gave medians within 2 % (1x32) and 8 % (8x8) of each
other (the baseline file holds all three). A regression worth stopping is larger (ORT on one thread instead
of two: 1.31x -> 0.82x, caught; bench/results/perf-baseline/), and 20 % stays clear of the spread. On a CPU
other than the baseline's the margin is 40 % (margin_for): the ratio itself depends on the CPU.
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

from bench.cpu_throughput import cpu_name, encode_rate, ensemble_rate, sentence_transformer
from bench.e2e_bench import parse_shapes
from common.settings import ROOT, load_settings
from loadtest.corpus import load_text
from model_repository.generate import generate
from model_repository.server import TritonServer
from model_repository.triton_command import Ports

BASELINE = ROOT / "bench" / "results" / "perf-baseline" / "cpu.json"
OTHER_MACHINE_MARGIN = 0.4


def measure(settings_path: str | None, overrides: list[str], texts: list[str], shapes: list[str], rounds: int) -> dict:
    """Per shape, the median over rounds of ensemble texts/s / sentence-transformers texts/s, where each round
    times sentence-transformers, then each shape, then sentence-transformers again (both sides drift on a
    shared machine, and a round's ratio only compares what ran side by side)."""
    settings = load_settings(settings_path, overrides)
    model = sentence_transformer(settings.model.source, texts, 32)
    work_dir = settings.build_dir / "perf_check"
    repository = generate(settings, settings.export_dir, work_dir / "model_repository")
    loads = dict(zip(shapes, parse_shapes(",".join(shapes)), strict=True))  # "1x32" -> (1, 32)
    ratios: dict[str, list[float]] = {shape: [] for shape in shapes}
    rates: dict[str, list[float]] = {shape: [] for shape in shapes}
    with TritonServer(settings, repository, Ports.free(), "127.0.0.1", work_dir=work_dir) as server:
        for per_request, concurrency in loads.values():  # warm-up
            asyncio.run(ensemble_rate(server.grpc_url, texts[:64], per_request, concurrency))
        references = [encode_rate(model, texts, 32)]
        for _ in range(rounds):
            served = {
                shape: asyncio.run(ensemble_rate(server.grpc_url, texts, per_request, concurrency))[0]
                for shape, (per_request, concurrency) in loads.items()
            }
            references.append(encode_rate(model, texts, 32))
            for shape, rate in served.items():
                rates[shape].append(round(rate, 1))
                ratios[shape].append(rate / ((references[-2] + references[-1]) / 2))
    return {
        "ratios": {shape: round(statistics.median(values), 3) for shape, values in ratios.items()},
        "round_ratios": {shape: [round(v, 3) for v in values] for shape, values in ratios.items()},
        "ensemble_texts_per_s": rates,
        "sentence_transformers_texts_per_s": [round(rate, 1) for rate in references],
    }


def margin_for(machine: dict, baseline_machine: dict, margin: float) -> float:
    """The margin, widened to OTHER_MACHINE_MARGIN on a machine of another kind than the baseline's: how fast
    the server runs next to sentence-transformers depends on the CPU (its vector units favour one or the other),
    so there only a gross regression counts."""
    same = (machine["cpu"], machine["cores"]) == (baseline_machine["cpu"], baseline_machine["cores"])
    return margin if same else max(margin, OTHER_MACHINE_MARGIN)


def compare(measured: dict, baseline: dict, margin: float) -> list[str]:
    """One line per shape whose ratio fell more than margin below the baseline's."""
    failures = []
    for shape, expected in baseline["ratios"].items():
        got = measured["ratios"].get(shape)
        if got is None or got < expected * (1 - margin):
            failures.append(
                f"{shape}: {got}x sentence-transformers, baseline {expected}x (more than {margin:.0%} lower)"
            )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf_check", description=__doc__)
    parser.add_argument("--settings", help="settings file (default: model_repository/settings.toml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="settings override")
    parser.add_argument("--texts", type=int, default=256, help="texts per timed run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", default="1x32,8x8", help="TEXTS_PER_REQUESTxCONCURRENCY, comma separated")
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update", action="store_true", help="measure three times and write the baseline")
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="where this run's JSON goes")
    args = parser.parse_args(argv)
    texts, shapes = load_text()[: args.texts], args.shapes.split(",")
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
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "command": "python -m bench.perf_check " + " ".join(sys.argv[1:] if argv is None else argv),
        "texts": args.texts,
        "rounds": args.rounds,
        **measured,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "perf_check.json").write_text(json.dumps(record, indent=2) + "\n")
    for shape, ratio in measured["ratios"].items():
        print(f"{shape}: median {ratio}x sentence-transformers of {measured['round_ratios'][shape]}")
    if args.update:
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        args.baseline.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote the baseline {args.baseline}")
        return 0
    baseline = json.loads(args.baseline.read_text())
    margin = margin_for(record["machine"], baseline["machine"], args.margin)
    if margin != args.margin:
        cpu, known = record["machine"]["cpu"], baseline["machine"]["cpu"]
        print(f"no baseline for this CPU ({cpu}): held to that of {known} within {margin:.0%}")
    failures = compare(measured, baseline, margin)
    for line in failures:
        print(f"perf-check FAILED {line}", file=sys.stderr)
    if not failures:
        print(f"perf-check passed: every ratio within {margin:.0%} of {args.baseline}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
