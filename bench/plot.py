"""python -m bench.plot RESULT.json [...]: PNG plots next to the benchmark JSON files.

e2e_bench.json -> latency vs throughput (p50 and p99 over the concurrency sweep) and a per-stage time
breakdown from Triton's statistics; engine_bench.json -> sequences/s vs batch size, engine vs baseline.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PHASES = ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")


def plot_e2e(result: dict, path: Path) -> None:
    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    rate = [r["inferences_per_s"] for r in runs]
    for key, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
        left.plot(rate, [r[key] for r in runs], style, label=key.replace("_ms", ""))
    for r in runs:
        left.annotate(f"c={r['concurrency']}", (r["inferences_per_s"], r["p99_ms"]), fontsize=7)
    left.set(xlabel="inferences/s", ylabel="latency (ms)", yscale="log", title="Ensemble latency vs throughput")
    left.legend()
    left.grid(alpha=0.3)

    stages = [name for name in ("tokenizer", "encoder", "postprocess") if name in runs[0]["stages"]]
    labels, bottoms = [f"c={r['concurrency']}" for r in runs], [0.0] * len(runs)
    for stage in stages:
        for phase in PHASES:
            values = [r["stages"].get(stage, {}).get(phase, 0) / 1e3 for r in runs]
            right.bar(labels, values, bottom=bottoms, label=f"{stage} {phase.removesuffix('_us')}")
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    right.set(ylabel="ms per request (Triton statistics)", title="Where the time goes, per stage")
    right.legend(fontsize=7)
    fig.suptitle(f"{result.get('gpu') or 'CPU'} · {result['date']} · {result['command']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_engine(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    series = {
        "engine (torch_gpu)": result["engine"],
        "transformers fp16, padded": result.get("baseline_transformers_fp16"),
    }
    for name, rows in series.items():
        if rows:
            batches = sorted(rows, key=int)
            ax.plot([int(b) for b in batches], [rows[b]["seq_per_s"] for b in batches], "o-", label=name)
    ax.set(xlabel="batch size (sequences)", ylabel="sequences/s", xscale="log", title="Engine-only throughput")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(f"{result.get('gpu', '')} · {result.get('date', '')[:10]} · {result.get('command', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path)
    for path in parser.parse_args(argv).results:
        result = json.loads(path.read_text())
        out = path.with_suffix(".png")
        (plot_e2e if result.get("benchmark") == "e2e_bench" else plot_engine)(result, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
