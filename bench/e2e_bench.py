"""python -m bench.e2e_bench: perf_analyzer over gRPC against the served text model, concurrency sweep.

For each settings file given (one per topology or shape, side by side in one run), it generates that
settings' model repository from the export, starts the real tritonserver on it, feeds perf_analyzer
corpus texts (loadtest/corpus.txt) and records per load shape (texts per request x requests in flight):
throughput, p50/p90/p99 latency, where the time went per model (Triton's statistics: queue, compute
input, infer, output, mean batch), the CPU microseconds per request of each process kind (tritonserver,
each model's stubs, perf_analyzer; /proc), tritonserver's busiest threads (does one core cap it?) and the
GPU's utilization, memory, power and clock (NVML).
--profile samples one stub of the given model with py-spy during the last shape. Writes e2e_bench.json
into --out after each server.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import tritonclient.grpc as grpcclient

from bench import process_cpu
from bench.gpu_sampler import GpuSampler
from common.contract import QUERY_INPUT, TEXT_INPUT
from loadtest.corpus import load_text
from loadtest.triton_stats import model_stats, stage_breakdown
from model_repository.generate import generate
from protocol.api_key import api_key, headers
from serving.launcher.harness import local_server
from serving.launcher.procfs import stub_processes
from settings import Settings, load_settings

# A reranker's rows: each corpus text scored against this query (perf_analyzer batches -b rows per request).
RERANK_QUERY = "How does Triton batch requests of different lengths?"


def perf_analyzer_input(texts: list[str], path: Path, query: str | None = None) -> None:
    """perf_analyzer's --input-data: one row per text (and a reranker's query in each row)."""
    rows = [{TEXT_INPUT: {"content": [text], "shape": [1]}} for text in texts]
    if query is not None:
        rows = [{QUERY_INPUT: {"content": [query], "shape": [1]}, **row} for row in rows]
    path.write_text(json.dumps({"data": rows}))


def run_perf_analyzer(
    binary: str,
    url: str,
    model: str,
    data: Path,
    concurrency: int,
    batch: int,
    interval_ms: int,
    stability: int,
    csv_path: Path,
    endpoint: str | None = None,
    max_threads: int | None = None,
    extra_headers: dict[str, str] | None = None,
) -> dict:
    """One perf_analyzer run at `concurrency`: KServe gRPC to `url`, or with `endpoint` its OpenAI mode, which
    posts each --input-data row's JSON payload as is to http://url/endpoint (asynchronous calls only), on at
    most `max_threads` threads (perf_analyzer's default: 16); `extra_headers` beside the API key's on HTTP."""
    protocol = "grpc" if endpoint is None else "http"
    service = ["--async", "--service-kind=openai", f"--endpoint={endpoint}"]
    if endpoint is None:
        service = ["-i", "grpc"]
    command = [
        binary, "-m", model, "-u", url, *service, "--input-data", str(data), "-b", str(batch),
        "--concurrency-range", str(concurrency), "--measurement-interval", str(interval_ms), "--max-trials", "8",
        "--stability-percentage", str(stability), "-f", str(csv_path),
        *(["--max-threads", str(max_threads)] if max_threads else []),
        *(item for name, value in {**headers(api_key(), protocol), **(extra_headers or {})}.items()
          for item in ("-H", f"{name}:{value}")),
    ]  # fmt: skip
    csv_path.unlink(missing_ok=True)  # exit code 2 reads the CSV: never a stale one
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wall_s = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    # Exit code 2 with a CSV: measured, but the windows never agreed within the stability bound.
    stable = run.returncode == 0
    if not stable and not (run.returncode == 2 and csv_path.is_file()):
        raise RuntimeError(f"perf_analyzer failed ({run.returncode}): {run.stderr[-2000:] or run.stdout[-2000:]}")
    with csv_path.open() as handle:
        row = next(csv.DictReader(handle))
    return {
        "model": model,
        "concurrency": concurrency,
        "texts_per_request": batch,
        "stable": stable,
        "inferences_per_s": float(row["Inferences/Second"]),  # texts per second
        **{f"{p}_ms": float(row[f"{p} latency"]) / 1e3 for p in ("p50", "p90", "p99")},
        # The load generator's own cost over its whole run (all trials).
        "client_cpu_s": round(cpu_s, 3),
        "client_cores_busy": round(cpu_s / wall_s, 2) if wall_s > 0 else None,
    }


def py_spy_profile(server_pid: int, model: str, seconds: int, out: Path, idle: bool = False) -> str | None:
    """Samples one stub of `model` for `seconds` in the background (py-spy record, collapsed stacks; with idle,
    the samples of threads that wait too, so that a lone request's wall time splits); the file it writes, or
    None without py-spy or such a stub."""
    binary = os.environ.get("PY_SPY") or shutil.which("py-spy")
    pids = stub_processes(server_pid).get(model)
    if not binary or not pids:
        return None
    path = out / f"py-spy-{model}.txt"
    subprocess.Popen(
        [binary, "record", "--pid", str(pids[0]), "--duration", str(seconds), "--rate", "200", "--format", "raw",
         "--output", str(path), "--nonblocking", *(["--idle"] if idle else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return str(path)


@contextlib.contextmanager
def served(settings: Settings, url: str | None, work: Path):
    """(gRPC url, tritonserver pid): a server started from `settings`, or the one at url."""
    if url:
        pids = process_cpu.find_processes("tritonserver")
        if len(pids) != 1:
            raise SystemExit(f"--url: found {len(pids)} tritonserver processes here; CPU figures need exactly one")
        yield url, pids[0]
        return
    repository = generate(settings, settings.export_dir, work / "repository")
    with local_server(settings, repository, work) as server:
        yield server.grpc_url, server.process.pid


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """ "1x1,1x256,8x64" -> [(texts per request, concurrency), ...]."""
    return [tuple(int(part) for part in shape.split("x")) for shape in text.split(",") if shape]


def sweep(settings: Settings, args, work: Path, texts: list[str]) -> dict:
    """One server from `settings`: every shape against the model clients call (texts per request: a reranker's
    pairs, each text against RERANK_QUERY)."""
    shapes = parse_shapes(args.shapes)
    runs = []
    work.mkdir(parents=True, exist_ok=True)
    data = work / "input.json"
    perf_analyzer_input(texts, data, RERANK_QUERY if settings.model.task == "rerank" else None)
    with served(settings, args.url, work) as (url, server_pid):
        stats_client = grpcclient.InferenceServerClient(url)
        if args.warmup_s:  # CUDA graphs for the common shapes, caches: not measured
            texts, concurrency = shapes[-1]
            run_perf_analyzer(
                args.perf_analyzer, url, args.model, data, concurrency, texts, args.warmup_s * 1000 // 3, 100,
                work / "warmup.csv",
            )  # fmt: skip
        model = args.model
        for texts, concurrency in shapes:
            before, cpu_before = model_stats(stats_client), process_cpu.snapshot(server_pid)
            threads_before = process_cpu.thread_cpu_s(server_pid)
            profile = None
            if args.profile and (texts, concurrency) == shapes[-1]:
                profile = py_spy_profile(server_pid, args.profile, 10, args.out, args.profile_idle)
            with GpuSampler() as gpu:
                row = run_perf_analyzer(
                    args.perf_analyzer, url, model, data, concurrency, texts, args.interval_ms, args.stability,
                    work / f"{model}-{texts}x{concurrency}.csv",
                )  # fmt: skip
            cpu_after, after = process_cpu.snapshot(server_pid), model_stats(stats_client)
            row["tritonserver_threads"] = process_cpu.busiest_threads(
                threads_before, process_cpu.thread_cpu_s(server_pid), cpu_after["wall"] - cpu_before["wall"]
            )
            row["stages"] = stage_breakdown(before, after)
            requests = row["stages"].get(model, {}).get("requests", 0)
            row["cpu"] = process_cpu.per_request(cpu_before, cpu_after, requests)
            if requests:  # perf_analyzer's CPU from its own rusage, over the same requests
                row["cpu"]["cpu_us_per_request"]["perf_analyzer"] = round(row["client_cpu_s"] / requests * 1e6, 1)
            row["gpu"] = gpu.summary()
            if profile:
                row["py_spy"] = profile
            runs.append(row)
            cpu = row["cpu"]["cpu_us_per_request"]
            row["server_cpu_us_per_request"] = round(
                sum(v for k, v in cpu.items() if k in ("tritonserver", "engine process") or k.endswith(" stubs")), 1
            )
            util = row["gpu"].get("gpu0", {}).get("utilization_pct_mean", "-")
            batching = row["cpu"].get("engine_batching")
            shared = f"  engine process {batching['sequences_per_batch']} seq/batch" if batching else ""
            print(
                f"{settings.path.name:28s} {model:12s} {texts}x{concurrency:<4d} "
                f"{row['inferences_per_s']:9.1f} texts/s  p50 {row['p50_ms']:6.2f} p99 {row['p99_ms']:6.2f} ms  "
                f"server CPU {row['server_cpu_us_per_request']:6.1f} us/req  GPU {util}%  "
                f"busiest tritonserver thread {row['tritonserver_threads'][0]['cores_busy']} cores{shared}",
                flush=True,
            )
    return {
        "settings_file": str(settings.path),
        "overrides": args.set,
        "topology": settings.topology,
        "settings": settings.as_dict(),
        "runs": runs,
    }


def bench_workspace(args, prefix: str) -> tuple[Path, list[str]]:
    """What a perf_analyzer benchmark needs before it starts: perf_analyzer found, --out made, a scratch folder,
    the first --texts corpus texts."""
    if shutil.which(args.perf_analyzer) is None:
        raise SystemExit(f"perf_analyzer not found ({args.perf_analyzer}); pass --perf-analyzer or PERF_ANALYZER")
    args.out.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix)), load_text()[: args.texts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e_bench", description=__doc__)
    parser.add_argument("--settings", action="append", help="settings file; repeat to compare (default: the default)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override in every settings file"
    )
    parser.add_argument(
        "--shapes", default="1x1,1x8,1x32,1x64,1x128,1x200,1x256", help="TEXTS_PER_REQUESTxCONCURRENCY, comma separated"
    )
    parser.add_argument("--profile", metavar="MODEL", help="py-spy one stub of MODEL during the last shape")
    parser.add_argument("--profile-idle", action="store_true", help="--profile samples waiting threads too")
    parser.add_argument("--warmup-s", type=int, default=0, help="unmeasured load at the last shape first")
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer measurement window")
    parser.add_argument("--stability", type=int, default=20, help="perf_analyzer --stability-percentage")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--gpu-name", default=os.environ.get("GPU_NAME", ""))
    parser.add_argument("--url", help="gRPC HOST:PORT of a running server on this host (default: start one)")
    parser.add_argument("--model", default="ensemble", help="the served model (with --url on a several-model server)")
    args = parser.parse_args(argv)
    work, texts = bench_workspace(args, "e2e_bench_")
    results = []
    for index, path in enumerate(args.settings or [None]):
        results.append(sweep(load_settings(path, args.set), args, work / f"server{index}", texts))
        write_result(args, argv, results)
    return 0


def write_result(args, argv, results: list[dict]) -> None:
    result = {
        "benchmark": "e2e_bench",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "gpu": args.gpu_name,
        "cpu_cores": os.cpu_count(),
        "command": "python -m bench.e2e_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "client": "perf_analyzer 2.51, gRPC, closed loop, corpus texts",
        "servers": results,
    }
    (args.out / "e2e_bench.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
