"""python -m bench.several_models: models served together against each served alone, in one run.

    python -m bench.several_models --settings EMBEDDER.toml RERANKER.toml --shape 1x256 --shape 32x16

For each settings file (one model each) and its shape (texts per request x requests in flight; a reranker's
texts are scored against one query, so 32x16 is 32 pairs a request): the engine alone (GPU settings: packed
ids in, rows out, batches of 64 texts or pairs), the model served alone (its own server), then one server of
every model: each under its own load while the others idle, and all under load at once (one perf_analyzer
per model, concurrently). Writes several_models.json into --out; prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.e2e_bench import RERANK_QUERY, bench_workspace, parse_shapes, perf_analyzer_input, run_perf_analyzer
from bench.engine_workload import settings_engine, time_calls
from model_repository.generate import generate
from serving.launcher.harness import local_server
from settings import Deployment, Settings, load_deployment


class Pairs(list):
    """A batch of a reranker's pairs: their ids, a list as time_calls counts it, and their token types beside."""

    types: list


def engine_alone(settings: Settings, texts: list[str], batch: int = 64) -> float | None:
    """Texts (a reranker's pairs) per second of the engine alone on encoder.gpus[0]; None on the CPU."""
    if not settings.encoder.gpus:
        return None
    from common.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(settings.export_dir / "tokenizer.json", settings.max_tokens())
    rerank = settings.model.task == "rerank"
    batches = []
    for start in range(0, len(texts) - batch + 1, batch):
        chunk = texts[start : start + batch]
        encodings = tokenizer.encode_batch([(RERANK_QUERY, text) for text in chunk] if rerank else chunk)
        rows = Pairs(np.array(e.ids, dtype=np.int32) for e in encodings)
        rows.types = [np.array(e.type_ids, dtype=np.int32) for e in encodings]
        batches.append(rows)
    engine = settings_engine(settings, f"cuda:{settings.encoder.gpus[0]}")
    run = (lambda rows: engine.forward(rows, rows.types)) if rerank else engine.forward
    return round(time_calls(run, batches, min_calls=50, min_seconds=3.0)["seq_per_s"], 1)


def measure(args, url: str, model: str, data: Path, shape: tuple[int, int], csv_path: Path) -> dict:
    texts, concurrency = shape
    row = run_perf_analyzer(
        args.perf_analyzer, url, model, data, concurrency, texts, args.interval_ms, args.stability, csv_path
    )
    return {key: row[key] for key in ("inferences_per_s", "p50_ms", "p99_ms", "stable", "client_cores_busy")}


def describe(label: str, model: str, shape: tuple[int, int], row: dict) -> None:
    print(
        f"{label:26s} {model:28s} {shape[0]}x{shape[1]:<4d} {row['inferences_per_s']:10.1f} texts/s  "
        f"p50 {row['p50_ms']:6.2f} p99 {row['p99_ms']:6.2f} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.several_models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", required=True, help="one settings file per model")
    parser.add_argument("--shape", action="append", required=True, help="TEXTSxCONCURRENCY, one per settings file")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer measurement window")
    parser.add_argument("--stability", type=int, default=20, help="perf_analyzer --stability-percentage")
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    deployment = load_deployment(args.settings)
    shapes = [parse_shapes(shape)[0] for shape in args.shape]
    if len(shapes) != len(deployment.models):
        raise SystemExit(f"{len(deployment.models)} settings files need as many --shape, not {len(shapes)}")
    work, texts = bench_workspace(args, "several_models_")
    data = []
    for index, settings in enumerate(deployment.models):
        data.append(work / f"input{index}.json")
        perf_analyzer_input(texts, data[-1], RERANK_QUERY if settings.model.task == "rerank" else None)
    result: dict = {"models": []}
    for index, (settings, shape) in enumerate(zip(deployment.models, shapes, strict=True)):
        entry = {"name": settings.model.name, "task": settings.model.task, "shape": f"{shape[0]}x{shape[1]}"}
        entry["engine_alone_texts_per_s"] = engine_alone(settings, texts)
        alone = Deployment((settings,))
        repository = generate(alone, out=work / f"alone{index}" / "repository")
        with local_server(alone, repository, work / f"alone{index}") as server:
            entry["served_alone"] = measure(args, server.grpc_url, "ensemble", data[index], shape, work / "a.csv")
        describe("served alone", settings.model.name, shape, entry["served_alone"])
        result["models"].append(entry)
    repository = generate(deployment, out=work / "together" / "repository")
    with local_server(deployment, repository, work / "together") as server:
        names = [deployment.names(settings).model for settings in deployment.models]
        for index, (entry, name, shape) in enumerate(zip(result["models"], names, shapes, strict=True)):
            entry["together_others_idle"] = measure(args, server.grpc_url, name, data[index], shape, work / "t.csv")
            entry["together_others_idle"]["vs_alone"] = round(
                entry["together_others_idle"]["inferences_per_s"] / entry["served_alone"]["inferences_per_s"], 3
            )
            describe("together, others idle", name, shape, entry["together_others_idle"])
        rows: dict = {}

        def load(index: int) -> None:
            csv_path = work / f"both{index}.csv"
            rows[index] = measure(args, server.grpc_url, names[index], data[index], shapes[index], csv_path)

        threads = [threading.Thread(target=load, args=(index,)) for index in range(len(names))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index, (entry, name, shape) in enumerate(zip(result["models"], names, shapes, strict=True)):
            entry["together_all_loaded"] = rows[index]
            describe("together, all under load", name, shape, rows[index])
    result |= {
        "benchmark": "several_models",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu_cores": os.cpu_count()},
        "command": "python -m bench.several_models " + " ".join(argv if argv is not None else sys.argv[1:]),
        "client": "perf_analyzer 2.51, gRPC, closed loop, corpus texts",
    }
    (args.out / "several_models.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
