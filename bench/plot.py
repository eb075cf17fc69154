"""python -m bench.plot RESULT.json [...]: PNG plots next to the benchmark JSON files.

e2e_bench.json -> per server (settings file): latency vs throughput over the one-text shapes, and the CPU
microseconds per request of each process kind; engine_bench.json -> sequences/s vs batch size, engine vs
baseline; cpu_throughput JSON -> texts/s of each load shape against sentence-transformers; front_cost.json
-> requests/s through the HTTP front and to tritonserver directly; api_cost.json -> requests/s, texts per
Triton request and CPU per request of every route at each concurrency. Other JSON (reliability) is named and skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_e2e(result: dict, path: Path) -> None:
    # Files written before e2e_bench compared servers hold one server's runs at the top level.
    servers = result.get("servers") or [{"settings_file": result.get("command", ""), "runs": result["runs"]}]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    bars, labels = [], []
    for server in servers:
        name = Path(server["settings_file"]).stem + "".join(f" {o}" for o in server.get("overrides", []))
        for model in sorted({r.get("model", "ensemble") for r in server["runs"]}):
            single = sorted(
                (r for r in server["runs"] if r.get("texts_per_request", 1) == 1 and r.get("model", model) == model),
                key=lambda r: r["concurrency"],
            )
            rate, label = [r["inferences_per_s"] for r in single], name + ("" if model == "ensemble" else f" {model}")
            for key, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
                left.plot(rate, [r[key] for r in single], style, label=f"{label} {key.removesuffix('_ms')}")
            for r in single:
                left.annotate(f"c={r['concurrency']}", (r["inferences_per_s"], r["p99_ms"]), fontsize=7)
        for r in server["runs"]:
            if "cpu" in r:
                bars.append(r["cpu"]["cpu_us_per_request"])
                labels.append(f"{name}\n{r.get('texts_per_request', 1)}x{r['concurrency']}")
    left.set(xlabel="texts/s (1 text per request)", ylabel="latency (ms)", yscale="log", title="Latency vs throughput")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    kinds = sorted({kind for row in bars for kind in row if kind != "host"})
    bottoms = [0.0] * len(bars)
    for kind in kinds:
        values = [row.get(kind, 0.0) for row in bars]
        right.bar(range(len(bars)), values, bottom=bottoms, label=kind)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    right.set_xticks(range(len(bars)), labels, fontsize=6, rotation=60, ha="right")
    right.set(ylabel="CPU us per request", title="CPU per request by process (/proc)")
    right.legend(fontsize=7)
    fig.suptitle(f"{result.get('gpu') or 'CPU'} · {result['date']} · {result['command']}"[:160], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_cpu_throughput(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = ["sentence-transformers"] + [f"{r['texts_per_request']} x {r['concurrency']}" for r in result["ensemble"]]
    rates = [result["sentence_transformers_texts_per_s"]] + [r["texts_per_s"] for r in result["ensemble"]]
    ax.bar(names, rates, color=["gray"] + ["tab:blue"] * len(result["ensemble"]))
    for index, rate in enumerate(rates):
        ax.annotate(f"{rate:.0f} ({rate / rates[0]:.2f}x)", (index, rate), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="texts/s", title=f"{result['model']} on {result['machine']['cores']} CPU cores")
    fig.suptitle(f"{result['machine']['cpu']} · {result['date']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_engine(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    series = {
        "engine (torch)": result["engine"],
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


def plot_front_cost(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    shapes = list(result["results"])
    for offset, route in ((-0.2, "front"), (0.2, "tritonserver")):
        rates = [statistics.mean(run["rps"] for run in result["results"][shape][route]) for shape in shapes]
        ax.bar([i + offset for i in range(len(shapes))], rates, width=0.4, label=route)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set(ylabel="requests/s (mean of rounds)", yscale="log", title="HTTP through the front vs tritonserver's own")
    ax.legend()
    fig.suptitle(f"{result['machine']} · {result['date'][:10]} · {result['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_api_cost(result: dict, path: Path) -> None:
    """Per concurrency and route: requests/s, texts per Triton request, and CPU per request by process kind."""
    levels = list(result["results"])
    routes = list(result["results"][levels[0]]["median_rps"])
    width = 0.8 / len(routes)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for number, route in enumerate(routes):
        runs = [result["results"][level]["runs"][route] for level in levels]
        x = [i + (number - (len(routes) - 1) / 2) * width for i in range(len(levels))]
        axes[0].bar(x, [result["results"][level]["median_rps"][route] for level in levels], width, label=route)
        # api_cost files of before 2026-12-02 did not count texts per Triton request: no bar for them
        per_call = [statistics.median(r.get("texts_per_triton_request", float("nan")) for r in run) for run in runs]
        axes[1].bar(x, per_call, width)
        cpu = [{k: statistics.median(r["cpu_us_per_request"][k] for r in run) for k in run[0]["cpu_us_per_request"]}
               for run in runs]  # fmt: skip
        bottom = [0.0] * len(levels)
        kinds = [k for k in cpu[0] if k != "host"]
        for shade, kind in enumerate(kinds):  # one colour per process kind, whatever the route
            values = [c[kind] for c in cpu]
            axes[2].bar(x, values, width, bottom=bottom, color=f"C{shade}", label=kind if number == 0 else None)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes[2].set_title("CPU per request; bars in the routes' order", fontsize=9)
    for ax, label in zip(axes, ("requests/s (median of rounds)", "texts per Triton request", "CPU us per request"),
                         strict=True):  # fmt: skip
        ax.set_xticks(range(len(levels)), levels)
        ax.set(ylabel=label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"{result['machine']} · {result['date'][:10]} · {result['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


PLOTS = {
    "api_cost": plot_api_cost,
    "e2e_bench": plot_e2e,
    "cpu_throughput": plot_cpu_throughput,
    "engine_bench": plot_engine,
    "front_cost": plot_front_cost,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path)
    for path in parser.parse_args(argv).results:
        result = json.loads(path.read_text())
        out = path.with_suffix(".png")
        # engine_bench.json files of before 2026-12-01 carry no "benchmark" key
        kind = result.get("benchmark", "engine_bench" if "engine" in result else None)
        if kind not in PLOTS:
            print(f"{path}: no plot for benchmark {kind!r} (plots: {', '.join(PLOTS)})")
            continue
        PLOTS[kind](result, out)
        plt.close("all")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
