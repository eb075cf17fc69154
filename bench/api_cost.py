"""python -m bench.api_cost: the API front (POST /v1/embeddings) against direct gRPC at the same concurrency.

Starts the real launcher (tritonserver, its fronts and the API front's api.workers processes) on free ports, and
beside it a second API front on the same tritonserver with api.coalesce_calls = 0 (every request a Triton call of
its own), and drives them with closed loops of `--concurrency` clients, one text of loadtest/corpus.txt per request:
`grpc` sends KServe ModelInfer requests straight to tritonserver, `api-base64` and `api-float` send OpenAI embedding
requests to the API front (base64 is what the OpenAI SDKs ask for by default), `api-base64-alone` the same as
api-base64 to the front that does not coalesce; not run unless named: `tei-embed` TEI's POST /embed to the API
front, `api-int8`, `api-uint8`, `api-binary` and `api-ubinary` /v1/embeddings in those encoding_formats
(quantization.py), and `cohere-float`, `cohere-int8` and `cohere-binary` Cohere's POST /v2/embed with that one
embedding type. `--generator python` (the default) spreads the clients over `--processes` Python processes
(grpc.aio, aiohttp, pre-serialized requests); `--generator perf_analyzer` runs tritonclient 2.51's compiled
perf_analyzer instead, on `--processes` threads, over gRPC for `grpc` and in its OpenAI mode (each JSON body posted
as is) for the HTTP routes: a load generator of other costs, measured beside the server's (docs/benchmarks.md).
Rounds alternate the routes so that all see the same machine state. Per route: requests/s, p50 and p99 latency,
texts per Triton request (Triton's own counters), and CPU microseconds per request of tritonserver, the stubs, each
front's workers (/proc) and the load generators (their own CPU time), Triton's own split of its requests' time
(queue, compute) and the batch of each execute() (`triton`), and, with the Python generator, the answer's bytes per
text as the client receives them (the HTTP body before any JSON parsing; for grpc the serialized ModelInferResponse;
one text a request), beside the float answer's where api-float ran. `--header NAME:VALUE` (repeatable) adds a header
to every HTTP route's requests in either generator, e.g. `X-Request-Timeout:1s` to time budgeted requests that are
all served. Writes api_cost.json; `python -m bench.plot` draws it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.e2e_bench import perf_analyzer_input, run_perf_analyzer
from bench.process_cpu import per_request, snapshot
from bench.record import header, write
from loadtest.corpus import load_text
from loadtest.triton_stats import model_stats, stage_breakdown, statistics_client
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, model_infer_request
from serving.api.app import command
from serving.launcher.harness import Launcher
from serving.launcher.procfs import child_processes
from serving.launcher.triton_command import Ports, free_ports
from serving.workers import FrontWorkers
from settings import load_settings

QUANTIZED_FORMATS = ("int8", "uint8", "binary", "ubinary")  # OpenAI encoding_format, beside float and base64
COHERE_TYPES = ("float", "int8", "binary")  # Cohere v2 embedding_types, one a route
ROUTES = (
    "grpc", "api-base64", "api-float", "api-base64-alone", "tei-embed",
    *(f"api-{name}" for name in QUANTIZED_FORMATS), *(f"cohere-{name}" for name in COHERE_TYPES),
)  # fmt: skip
DEFAULT_ROUTES = ROUTES[:3]


def request_body(route: str, model: str, text: str) -> dict:
    """The JSON body an HTTP route sends for one text, whichever generator sends it."""
    if route == "tei-embed":
        return {"inputs": text}
    if route.startswith("cohere-"):
        kind = route.removeprefix("cohere-")
        return {"model": model, "texts": [text], "input_type": "search_document", "embedding_types": [kind]}
    return {"model": model, "input": text, "encoding_format": route.removeprefix("api-").removesuffix("-alone")}


async def _grpc_loop(target: str, texts: list[str], clients: int, deadline: float) -> tuple[list[float], int]:
    """The closed loops' latencies and the bytes of every answer (the serialized ModelInferResponse)."""
    import grpc

    bodies = [model_infer_request("ensemble", [text]) for text in texts]
    latencies: list[float] = []
    received = 0
    async with grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_ARGS) as channel:
        call = channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)

        async def client(offset: int) -> None:
            nonlocal received
            index = offset
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                answer = await call(bodies[index % len(bodies)], timeout=60)
                received += len(
                    answer
                )  # not `received += len(await ...)`: that adds to the value read before the await
                latencies.append(time.perf_counter() - started)
                index += clients

        await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, received


async def _api_loop(
    url: str, bodies: list[bytes], clients: int, deadline: float, extra: dict[str, str]
) -> tuple[list[float], int]:
    """The closed loops' latencies and the bytes of every answer's body, as read off the wire (not parsed)."""
    import aiohttp

    headers = {"Content-Type": "application/json", **extra}
    latencies: list[float] = []
    received = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client(offset: int) -> None:
            nonlocal received
            index = offset
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with session.post(url, data=bodies[index % len(bodies)], headers=headers) as response:
                    body = await response.read()
                    received += len(body)
                    if response.status != 200:
                        raise RuntimeError(f"{url} answered {response.status}")
                latencies.append(time.perf_counter() - started)
                index += clients

        await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, received


def load_process(job: tuple) -> tuple[list[float], float, int]:
    """One load generator: its closed loop's latencies, its own CPU seconds and the bytes it received."""
    route, address, model, texts, clients, duration_s, extra = job
    cpu = time.process_time()
    deadline = time.perf_counter() + duration_s
    if route == "grpc":
        latencies, received = asyncio.run(_grpc_loop(address, texts, clients, deadline))
    else:
        bodies = [json.dumps(request_body(route, model, text)).encode() for text in texts]
        latencies, received = asyncio.run(_api_loop(address, bodies, clients, deadline, extra))
    return latencies, time.process_time() - cpu, received


@dataclass(frozen=True)
class Target:
    """What every run drives: the model, the texts, how many load processes, and whose CPU to count."""

    model: str
    texts: list[str]
    processes: int
    server_pid: int
    api_pids: dict[str, list[int]]  # each front's workers
    headers: dict[str, str]  # added to the HTTP routes' requests (--header)
    stats_address: str  # Triton's gRPC, for its statistics API (ensemble_stats)


def launcher_target(
    launcher: Launcher,
    model: str,
    texts: list[str],
    processes: int,
    others: dict[str, list[int]] | None = None,
    headers: dict[str, str] | None = None,
) -> Target:
    """What drives the launcher's server: its tritonserver, its API workers (and `others`) to count the CPU of."""
    workers = [pid for pid, _, argv in child_processes(launcher.process.pid) if b"serving.api" in argv]
    pids = {"api workers": workers, **(others or {})}
    stats = f"127.0.0.1:{launcher.ports.grpc}"
    return Target(model, texts, processes, launcher.triton_pid, pids, headers or {}, stats)


def addresses(ports: Ports) -> dict[str, str]:
    """Where each route of the launcher on `ports` sends its requests."""
    api = f"http://127.0.0.1:{ports.api}/v1/embeddings"
    tei = f"http://127.0.0.1:{ports.api}/embed"
    cohere = {f"cohere-{name}": f"http://127.0.0.1:{ports.api}/v2/embed" for name in COHERE_TYPES}
    openai = {f"api-{name}": api for name in ("base64", "float", *QUANTIZED_FORMATS)}
    grpc = f"127.0.0.1:{ports.grpc}"
    return {"grpc": grpc, **openai, "tei-embed": tei, **cohere}


def ensemble_stats(target: Target) -> dict[str, dict]:
    """Triton's cumulative statistics (loadtest/triton_stats.py) of the ensemble and its query lane."""
    client = statistics_client(target.stats_address, "grpc")
    try:
        return {name: row for name, row in model_stats(client).items() if name.startswith("ensemble")}
    finally:
        client.close()


def triton_requests(stats: dict[str, dict]) -> tuple[int, int]:
    """(texts, requests) the ensemble and its query lane have answered so far, from ensemble_stats()."""
    return sum(row["inferences"] for row in stats.values()), sum(row["requests"] for row in stats.values())


def measured(target: Target, load: Callable[[], tuple[dict, float]]) -> dict:
    """`load` (its requests/s and latencies, and the load generator's CPU seconds) between two snapshots of the
    server's CPU and Triton's counters (its statistics API): the figures, texts per Triton request, CPU per request
    of each kind, and for the ensemble and its query lane each, the mean queue and compute time of a Triton request
    and the mean batch of an execute() (`triton`). Requests are Triton's texts (one per request) where `load` does
    not count them itself."""
    others = target.api_pids
    before, stats_before = snapshot(target.server_pid, others), ensemble_stats(target)
    figures, generator_cpu_s = load()
    stats_after, after = ensemble_stats(target), snapshot(target.server_pid, others)
    (texts_before, calls_before), (texts, calls) = triton_requests(stats_before), triton_requests(stats_after)
    requests = figures.get("requests", int(texts - texts_before))
    cost = per_request(before, after, requests)
    cost["cpu_us_per_request"]["load generators"] = round(generator_cpu_s / requests * 1e6, 1)
    return {
        "requests": requests,
        **figures,
        "texts_per_triton_request": round((texts - texts_before) / max(calls - calls_before, 1.0), 2),
        **cost,
        "triton": stage_breakdown(stats_before, stats_after),
    }


def run_route(pool, target: Target, route: str, address: str, concurrency: int, duration_s: float) -> dict:
    """One run of the Python load generators, `pool`'s processes, each with its share of the clients."""
    processes = target.processes
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    jobs = [
        (route, address, target.model, target.texts[i::processes], clients, duration_s, target.headers)
        for i, clients in enumerate(shares)
        if clients
    ]

    def load() -> tuple[dict, float]:
        started = time.perf_counter()
        results = pool.map(load_process, jobs)
        seconds = time.perf_counter() - started
        latencies = sorted(latency for part, _, _ in results for latency in part)
        figures = {
            "requests": len(latencies),
            "rps": round(len(latencies) / seconds, 1),
            "p50_ms": round(1000 * statistics.median(latencies), 3),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 3),
            "bytes_per_text": round(sum(received for _, _, received in results) / len(latencies), 1),
        }
        return figures, sum(cpu for _, cpu, _ in results)

    return measured(target, load)


def summary(runs: dict[str, list[dict]]) -> dict:
    """Each route's median req/s over its rounds and its mean answer bytes per text (the Python generator's; None
    from perf_analyzer), and both against grpc's, api-float's and api-base64-alone's where those ran."""
    medians = {route: statistics.median(run["rps"] for run in done) for route, done in runs.items()}
    sizes = {
        route: round(statistics.fmean(run["bytes_per_text"] for run in done), 1) if "bytes_per_text" in done[0]
        else None
        for route, done in runs.items()
    }  # fmt: skip
    ratios = {route: round(rps / medians["grpc"], 3) for route, rps in medians.items()} if "grpc" in medians else {}
    if {"api-base64", "api-base64-alone"} <= set(medians):
        ratios["coalesced_vs_alone"] = round(medians["api-base64"] / medians["api-base64-alone"], 3)
    result = {"runs": runs, "median_rps": medians, "bytes_per_text": sizes, "vs_grpc": ratios}
    if "api-float" in medians:
        result["vs_float"] = {
            route: {
                "rps": round(rps / medians["api-float"], 3),
                "bytes": round(sizes[route] / sizes["api-float"], 3) if sizes[route] and sizes["api-float"] else None,
            }
            for route, rps in medians.items()
        }
    return result


def perf_analyzer_data(route: str, model: str, texts: list[str]) -> dict:
    """perf_analyzer's --input-data for an HTTP route in its OpenAI mode: one request body per text."""
    return {"data": [{"payload": [request_body(route, model, text)]} for text in texts]}


@dataclass(frozen=True)
class PerfAnalyzer:
    """perf_analyzer as the load generator: one process of `--processes` threads (each thread keeps several
    requests in flight: its calls are asynchronous); its input data and CSVs in `work`."""

    binary: str
    work: Path

    def run_route(self, target: Target, route: str, address: str, concurrency: int, duration_s: float) -> dict:
        data, csv_path = self.work / f"{route}.json", self.work / f"{route}.csv"
        if route == "grpc":
            url, endpoint, model = address, None, "ensemble"
            if not data.exists():
                perf_analyzer_input(target.texts, data)
        else:
            where = urlsplit(address)
            url, endpoint, model = where.netloc, where.path.removeprefix("/"), target.model
            if not data.exists():
                data.write_text(json.dumps(perf_analyzer_data(route, target.model, target.texts)))

        def load() -> tuple[dict, float]:
            # Three windows of a third of duration_s each, whatever their spread (perf_analyzer's shortest
            # stable run), reported as one: a round as long as the Python generator's.
            row = run_perf_analyzer(
                self.binary, url, model, data, concurrency, 1, round(duration_s * 1000 / 3), 999, csv_path,
                endpoint=endpoint, max_threads=target.processes,
                extra_headers=target.headers if endpoint else None,  # HTTP only: gRPC metadata is lower case
            )  # fmt: skip
            figures = {"rps": round(row["inferences_per_s"], 1), "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"]}
            return figures, row["client_cpu_s"]

        return measured(target, load)


def profile_worker(pid: int, seconds: float, path: Path) -> None:
    """py-spy samples one API worker in the background for `seconds` (collapsed stacks into path)."""
    binary = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if binary:
        subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
             "--format", "raw", "--output", str(path), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip


GENERATORS = {
    "python": "python: asyncio closed loops (grpc.aio, aiohttp, pre-serialized requests), --processes {processes}",
    "perf_analyzer": "perf_analyzer 2.51 (C++), --max-threads {processes}: KServe gRPC for grpc, OpenAI mode for the "
    "HTTP routes; its CPU over its whole run (start, reading the input data, three windows) per text Triton answered",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    parser.add_argument(
        "--generator", choices=("python", "perf_analyzer"), default="python", help="what sends the requests"
    )
    parser.add_argument("--processes", type=int, default=2, help="Python processes, or perf_analyzer's threads")
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    parser.add_argument("--duration-s", type=float, default=10.0, help="per route, concurrency and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(DEFAULT_ROUTES))
    parser.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="a header on every HTTP route's request"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy one API worker in the first api round")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="settings override, e.g. encoder.instances=4"
    )
    args = parser.parse_args(argv)
    if args.generator == "perf_analyzer" and shutil.which(args.perf_analyzer) is None:
        raise SystemExit(f"perf_analyzer not found ({args.perf_analyzer}); pass --perf-analyzer or PERF_ANALYZER")
    settings = load_settings(args.settings, args.set)
    texts = load_text()
    args.out.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    launcher = Launcher(
        settings.path, settings.repository_dir, ports, args.out / "api_cost_launcher.log", args.set
    ).start()
    (alone_port,) = free_ports(1)
    local = (
        f"127.0.0.1:{ports.grpc}",
        f"http://127.0.0.1:{ports.health}/ready",
        f"http://127.0.0.1:{ports.metrics}/metrics",
    )
    arguments = command([settings.path], settings.repository_dir, "127.0.0.1", alone_port, *local)
    arguments += [item for override in args.set for item in ("--set", override)]
    alone = FrontWorkers(
        "API front (coalesce_calls = 0)", [*arguments, "--set", "api.coalesce_calls=0"], settings.api.worker_count(),
        "127.0.0.1", alone_port,
    ).start(timeout_s=60)  # fmt: skip
    routes = {**addresses(ports), "api-base64-alone": f"http://127.0.0.1:{alone_port}/v1/embeddings"}
    results: dict = {}
    try:
        alone_pids = {"api workers (alone)": [process.pid for process in alone.processes]}
        extra = dict(item.split(":", 1) for item in args.header)
        target = launcher_target(launcher, settings.model.name, texts, args.processes, alone_pids, extra)
        with contextlib.ExitStack() as stack:
            if args.generator == "python":
                pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(args.processes))
                drive = functools.partial(run_route, pool)
            else:
                work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="api_cost_")))
                drive = PerfAnalyzer(args.perf_analyzer, work).run_route
            for concurrency in args.concurrency:
                for route in args.routes:  # warm-up
                    drive(target, route, routes[route], concurrency, 2.0)
                runs: dict[str, list[dict]] = {route: [] for route in args.routes}
                for index in range(args.rounds):
                    for route in args.routes:
                        if args.profile and index == 0 and route == "api-base64":
                            profile_worker(
                                target.api_pids["api workers"][0],
                                args.duration_s,
                                args.out / f"py-spy-api-c{concurrency}.txt",
                            )
                        runs[route].append(drive(target, route, routes[route], concurrency, args.duration_s))
                results[f"c={concurrency}"] = found = summary(runs)
                print(f"c={concurrency}", found["median_rps"], found["bytes_per_text"], found["vs_grpc"], flush=True)
    finally:
        alone.stop()
        launcher.terminate()
        launcher.process.wait(timeout=60)
    record = {
        **header("api_cost", argv),
        "settings": str(settings.path),
        "overrides": args.set,
        "headers": args.header,
        "api_workers": settings.api.worker_count(),
        "coalesce": {"calls": settings.api.coalesce_calls, "window_ms": settings.api.coalesce_window_ms},
        "generator": GENERATORS[args.generator].format(processes=args.processes),
        "note": "load generators, API front and tritonserver share the machine; rounds alternate the routes",
        "results": results,
    }
    write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
