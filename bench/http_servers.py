"""python -m bench.http_servers: what each HTTP server on PyPI costs per /v1/embeddings request, without Triton.

The API front's CPU per request (bench.api_cost) is the HTTP server's, the front's own JSON work and its gRPC
call. This isolates the first two to choose the server by measurement: every option serves POST /v1/embeddings
with the same work the front does around its Triton call (orjson, serving/api/schema.py's openai_request and
openai_response, service.answer's orjson), answering with one fixed unit vector of `--dims` per text (the
embedding the model would have sent; nothing else is stubbed). Options: `aiohttp` (the front),
`aiohttp-uvloop`, `granian` (Rust HTTP, RSGI, one worker of one runtime thread, uvloop), each one process
pinned to the last core; an option whose package is missing is skipped, with the reason in the record. The
load is a closed loop of `--concurrency` connections from wrk (Debian's; pinned to the other cores) or, where
wrk is missing, perf_analyzer's OpenAI mode; rounds alternate the servers. Per server and concurrency:
requests/s, p50/p99, and the server's CPU microseconds per request (/proc, all its processes and threads,
over the requests it counted itself). A server cheaper here need not be cheaper in the front: granian,
embedded in the front's asyncio loop, served the H200's real path 6-21 % slower than aiohttp (docs/api.md).

It also times the JSON answer alone per encoder (`--dims` floats, 1 and 8 texts): orjson on numpy rows (the
front), orjson on lists, the standard json module, msgspec where installed, and base64 (OpenAI SDKs' default).
Writes http_servers.json into --out.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path

import numpy as np
import orjson

from bench.record import header, write
from serving.api.schema import Limits, openai_request, openai_response
from serving.launcher.procfs import child_processes, process_cpu_s
from serving.launcher.triton_command import free_ports

SERVERS = {"aiohttp": "aiohttp", "aiohttp-uvloop": "uvloop", "granian": "granian"}  # option: the package it needs
TEXT = "A man is eating food while sitting at a table in the garden, and the waiter brings more bread."
ROUTE = "/v1/embeddings"


def vector(dims: int) -> np.ndarray:
    row = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    return row / np.linalg.norm(row)


class Answerer:
    """What the API front does for one /v1/embeddings request around its Triton call (routes_openai.py), and
    how many it has answered (GET /served: the requests the CPU is divided by, whatever the generator)."""

    def __init__(self, dims: int) -> None:
        self.row, self.answered = vector(dims), 0
        self.limits = Limits(2048, 1 << 20, dims)  # the front's per model, made once (serving/api/models.py)

    def __call__(self, body: bytes) -> bytes:
        parsed = openai_request(orjson.loads(body), self.limits)
        vectors = np.broadcast_to(self.row, (len(parsed.encoded), self.row.size))
        tokens = np.array([len(text) // 4 for text in parsed.encoded], dtype=np.int32)
        answer = openai_response(vectors, tokens, parsed.encoding_format, "bert")
        self.answered += 1
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def serve(kind: str, port: int, dims: int) -> None:
    """One server process of option `kind` on 127.0.0.1:port."""
    if kind.startswith("aiohttp"):
        from aiohttp import web

        if kind == "aiohttp-uvloop":
            import uvloop

            uvloop.install()

        answerer = Answerer(dims)

        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=answerer(await request.read()), content_type="application/json")

        async def served(request: web.Request) -> web.Response:
            return web.Response(text=str(answerer.answered))

        app = web.Application()
        app.router.add_post(ROUTE, handler)
        app.router.add_get("/served", served)
        web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
    elif kind == "granian":
        from granian import Granian
        from granian.constants import Interfaces, Loops

        os.environ["BENCH_HTTP_DIMS"] = str(dims)
        Granian(
            "bench.http_servers:rsgi_app", address="127.0.0.1", port=port, interface=Interfaces.RSGI, workers=1,
            runtime_threads=1, loop=Loops.uvloop, log_enabled=False,
        ).serve()  # fmt: skip
    else:
        raise SystemExit(f"unknown server {kind!r}")


class RsgiApp:
    """granian's RSGI application (its worker imports `rsgi_app` by name and calls __rsgi_init__ first)."""

    def __rsgi_init__(self, loop) -> None:
        self.answerer = Answerer(int(os.environ["BENCH_HTTP_DIMS"]))

    async def __rsgi__(self, scope, protocol) -> None:
        if scope.method == "GET":
            protocol.response_str(200, [("content-type", "text/plain")], str(self.answerer.answered))
            return
        body = await protocol()
        protocol.response_bytes(200, [("content-type", "application/json")], self.answerer(body))


rsgi_app = RsgiApp()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants (granian serves from a child process)."""
    children = [child for child, _, _ in child_processes(pid)]
    return process_cpu_s(pid) + sum(tree_cpu_s(child) for child in children)


def post_body(encoding: str) -> bytes:
    return json.dumps({"model": "bert", "input": TEXT, "encoding_format": encoding}).encode()


class Server:
    """One option's server process, started and answering."""

    def __init__(self, kind: str, dims: int, core: int) -> None:
        self.kind, self.port = kind, free_ports(1)[0]
        command = [sys.executable, "-m", "bench.http_servers", "--serve", kind, "--port", str(self.port)]
        self.process = subprocess.Popen(
            ["taskset", "-c", str(core), *command, "--dims", str(dims)], stdout=subprocess.DEVNULL
        )
        self.url = f"http://127.0.0.1:{self.port}{ROUTE}"
        self.served_url = f"http://127.0.0.1:{self.port}/served"
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(self.url, post_body("base64"), {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    check = orjson.loads(response.read())
                assert len(base64.b64decode(check["data"][0]["embedding"])) == 4 * dims, check
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} did not start (exit {self.process.poll()})") from None
                time.sleep(0.2)

    def served(self) -> int:
        with urllib.request.urlopen(self.served_url, timeout=5) as response:
            return int(response.read())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def wrk_load(binary: str, url: str, body: bytes, concurrency: int, seconds: float, cores: str, work: Path) -> dict:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'done = function(summary, latency, requests)\n  io.write(string.format("RESULT %d %d %d %d\\n", '
        "summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read + "
        "summary.errors.write + summary.errors.timeout, latency:percentile(50), latency:percentile(99)))\nend\n"
    )
    threads = min(concurrency, max(1, len(cores.split(","))))
    command = ["taskset", "-c", cores, binary, f"-t{threads}", f"-c{concurrency}", f"-d{seconds:g}s", "-s", str(script)]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    requests, errors, p50_us, p99_us = map(int, output.split("RESULT")[1].split())
    if errors:
        raise RuntimeError(f"wrk saw {errors} errors against {url}")
    return {"rps": round(requests / seconds, 1), "p50_ms": p50_us / 1e3, "p99_ms": p99_us / 1e3}


def perf_analyzer_load(binary: str, url: str, body: bytes, concurrency: int, seconds: float, work: Path) -> dict:
    from bench.e2e_bench import run_perf_analyzer

    data = work / "openai.json"
    data.write_text(json.dumps({"data": [{"payload": [json.loads(body)]}]}))
    row = run_perf_analyzer(
        binary, url.split("/")[2], "bert", data, concurrency, 1, round(seconds * 1000 / 3), 999, work / "pa.csv",
        endpoint=ROUTE.removeprefix("/"), max_threads=4,
    )  # fmt: skip
    return {"rps": round(row["inferences_per_s"], 1), "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"]}


def encoder_ways(rows: np.ndarray, tokens: np.ndarray) -> dict:
    """Each encoder's way to write the same answer."""
    ways = {
        "orjson numpy rows (the front)": lambda: orjson.dumps(
            openai_response(rows, tokens, "float", "bert"), option=orjson.OPT_SERIALIZE_NUMPY
        ),
        "orjson lists": lambda: orjson.dumps(openai_response(rows.tolist(), tokens, "float", "bert")),
        "json lists": lambda: json.dumps(openai_response(rows.tolist(), tokens, "float", "bert")).encode(),
        "orjson base64": lambda: orjson.dumps(openai_response(rows, tokens, "base64", "bert")),
    }
    if importlib.util.find_spec("msgspec"):
        import msgspec

        encoder = msgspec.json.Encoder()
        ways["msgspec lists"] = lambda: encoder.encode(openai_response(rows.tolist(), tokens, "float", "bert"))
    return ways


def encoders(dims: int, repeat: int = 2000) -> dict:
    """Microseconds to write the JSON answer of 1 and 8 texts, per encoder."""
    found: dict[str, dict] = {}
    for texts in (1, 8):
        rows = np.broadcast_to(vector(dims), (texts, dims)).copy()
        for name, way in encoder_ways(rows, np.full(texts, 24, dtype=np.int32)).items():
            seconds = min(timeit.repeat(way, number=repeat // texts, repeat=5)) / (repeat // texts)
            found.setdefault(name, {})[f"{texts}_texts_us"] = round(seconds * 1e6, 1)
            found[name][f"{texts}_texts_bytes"] = len(way())
    return found


def measure(kind: str, concurrency: int, args, body: bytes, cores: tuple[int, str], work: Path) -> dict:
    """One server of option `kind` under one closed loop: the generator's figures and the server's CPU."""
    server_core, load_cores = cores
    server = Server(kind, args.dims, server_core)
    wrk = shutil.which("wrk")

    def load(seconds: float) -> dict:
        if wrk:
            return wrk_load(wrk, server.url, body, concurrency, seconds, load_cores, work)
        return perf_analyzer_load(args.perf_analyzer, server.url, body, concurrency, seconds, work)

    try:
        load(1.0)  # warm-up
        before, answered = tree_cpu_s(server.process.pid), server.served()
        figures = load(args.duration_s)
        spent = tree_cpu_s(server.process.pid) - before
        figures["requests"] = server.served() - answered
    finally:
        server.stop()
    figures["server_cpu_us_per_request"] = round(spent / figures["requests"] * 1e6, 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_servers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=list(SERVERS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--encoding", choices=["base64", "float"], default="base64")
    parser.add_argument("--dims", type=int, default=768, help="embedding width (BERT-base: 768)")
    parser.add_argument("--duration-s", type=float, default=8.0, help="per server, concurrency and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--perf-analyzer", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"))
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.dims)
        return 0
    cores = sorted(os.sched_getaffinity(0))
    server_core, load_cores = cores[-1], ",".join(map(str, cores[:-1] or cores))
    generator = "wrk" if shutil.which("wrk") else "perf_analyzer"
    record = header("http_servers", argv)
    record.update(
        generator=f"{generator} on cores {load_cores}, server on core {server_core}",
        encoding=args.encoding, dims=args.dims, skipped={}, runs=[],
    )  # fmt: skip
    available = []
    for kind in args.servers:
        if importlib.util.find_spec(SERVERS[kind]) is None:
            record["skipped"][kind] = f"package {SERVERS[kind]} is not installed"
        else:
            available.append(kind)
    body = post_body(args.encoding)
    with tempfile.TemporaryDirectory() as work:
        for round_index in range(args.rounds):
            for concurrency in args.concurrency:
                for kind in available:
                    figures = measure(kind, concurrency, args, body, (server_core, load_cores), Path(work))
                    run = {"server": kind, "concurrency": concurrency, "round": round_index, **figures}
                    record["runs"].append(run)
                    print(json.dumps(run), flush=True)
    record["encoders"] = encoders(args.dims)
    print(json.dumps(record["encoders"], indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
