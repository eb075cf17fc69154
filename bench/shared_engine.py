"""python -m bench.shared_engine: several processes calling one engine process, against each with an engine of its own.

The question (issue 45's c=64 and 8 x 64 cells, 2026-12-07): the served model's 8 stubs are 8 CUDA contexts, each
running the small batches Triton hands it (6-10 texts at c=64 on an H100), which the GPU time-slices: an execute()
of 5-10 texts took 2.1-5.5 ms of compute where the engine alone runs a batch of 8 in about 0.6 ms
(docs/results/h100/2026-12-07-d/). Would one process that owns the GPU and runs the stubs' batches together, as TEI's
router hands one backend its batches, serve the same calls at a higher rate and a lower latency?

Both modes run the same workload: `--clients` processes in closed loops, each call `--texts` sequences (lengths as
engine_bench draws them) after `--host-us` of busy CPU (a stub's own work between engine calls: tokenizing, the
Python backend's hand-over); beside them `--query-clients` processes send one-text queries at `--query-rate` each
(the query lane's stub). `own`: each process loads the torch engine and calls Engine.submit / collect itself.
`shared`: the serving path's engine process (model_repository/stages/engines/engine_process.py, as
`engine.options.shared_process` runs it): this process starts it through a SharedEngine and warms every batch size a
run can form; each client calls it through a SharedEngine of its own (the query clients flagged as the query lane's),
and it runs the waiting queries first, else the waiting calls up to its token bound, as one batch, the next launched
before the last one's rows are sent. Reported per mode: the stubs' sequences/s and per-call p50/p99, the queries'
p50/p99, and the largest difference of a client's first rows computed again at the end (beside other calls in shared
mode).
`mps`: as `own`, with an MPS control daemon of the run's own (its pipe and log folders in the run's temporary folder,
quit at the end), so the processes' kernels share the GPU at once instead of taking turns as contexts: the same
effect without a new process in the serving path, if the host lets a container start the daemon.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def workload(seed: int, texts: int, count: int = 64) -> list[tuple[np.ndarray, np.ndarray]]:
    from bench.engine_workload import batches_for
    from model_repository.stages.engines.base import pack_sequences

    return [pack_sequences(batch) for batch in batches_for(texts, seed=seed)[:count]]


def load(model_dir: str, device: str, precision: str):
    from model_repository.stages.engines import load_engine

    return load_engine("torch", Path(model_dir), device, {"precision": precision} if device != "cpu" else {})


def client(index: int, args: dict, start: mp.Event, stop: mp.Event, out: mp.Queue) -> None:
    """One stub: its own engine (`own`), or the server's (`shared`), from `start` to `stop`: a closed loop of
    args["texts"] sequences a call, or (index past args["clients"]) one-text queries at args["query_rate"]."""
    query = index >= args["clients"]
    batches = workload(index, 1 if query else args["texts"])
    if args["mode"] in ("own", "mps"):
        engine = load(args["model_dir"], args["device"], args["precision"])
    else:
        engine = shared_engine(args, query)

    def call(ids, lengths):
        return engine.submit(ids, lengths)()

    first = call(*batches[0])
    for ids, lengths in batches[1:]:  # warm: the graphs of every batch this client sends
        call(ids, lengths)
    out.put(("ready", index))
    start.wait()
    latencies, sequences, calls = [], 0, 0
    due = time.perf_counter()
    while not stop.is_set():
        ids, lengths = batches[calls % len(batches)]
        if query:  # open loop: each query at its time
            due += 1 / args["query_rate"]
            time.sleep(max(0.0, due - time.perf_counter()))
        busy(args["host_us"])
        began = time.perf_counter()
        call(ids, lengths)
        latencies.append(time.perf_counter() - began)
        sequences, calls = sequences + len(lengths), calls + 1
    # The first call's rows again, now computed beside other calls: a row handed to the wrong caller shows here.
    drift = float(np.abs(np.asarray(call(*batches[0]), np.float32).reshape(-1) - np.asarray(first).reshape(-1)).max())
    out.put(("done", query, sequences, latencies, drift))


def shared_engine(args: dict, query: bool = False):
    """A SharedEngine on the run's engine process (started by the first caller, ended with args["owner_pid"])."""
    from common.contract import ServingSpec
    from model_repository.stages.engines.shared import SharedEngine

    options = {"inner_kind": "torch", "query": query, "parent_pid": args["owner_pid"]}
    if args["device"] != "cpu":
        options["precision"] = args["precision"]
    return SharedEngine(Path(args["model_dir"]), ServingSpec.load(args["model_dir"]), args["device"], options)


class MpsDaemon:
    """nvidia-cuda-mps-control -d for one run: its folders under `folder`, its environment in os.environ while it runs
    (the spawned clients inherit it), quit and the environment restored at the end."""

    def __init__(self, folder: Path) -> None:
        self.binary = shutil.which("nvidia-cuda-mps-control")
        if self.binary is None:
            raise RuntimeError("nvidia-cuda-mps-control is not on PATH")
        self.env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(folder / "mps-pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(folder / "mps-log"),
        }
        self.saved = {name: os.environ.get(name) for name in self.env}

    def control(self, command: str) -> str:
        return subprocess.run([self.binary], input=command + "\n", capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=30).stdout.strip()  # fmt: skip

    def __enter__(self) -> MpsDaemon:
        for path in self.env.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        subprocess.run([self.binary, "-d"], env={**os.environ, **self.env}, check=True, timeout=30)
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc) -> None:
        self.control("quit")
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run(mode: str, args: argparse.Namespace, model_dir: str, folder: Path) -> dict:
    if mode == "mps":
        with MpsDaemon(folder) as daemon:
            return timed(mode, args, model_dir, daemon)
    return timed(mode, args, model_dir, None)


def timed(mode: str, args: argparse.Namespace, model_dir: str, daemon: MpsDaemon | None) -> dict:
    owner = subprocess.Popen(["sleep", "3600"])  # the engine process of a shared run ends with it
    try:
        return run_clients(mode, args, model_dir, daemon, owner.pid)
    finally:
        owner.kill()
        owner.wait()


def run_clients(mode: str, args: argparse.Namespace, model_dir: str, daemon: MpsDaemon | None, owner: int) -> dict:
    ctx = mp.get_context("spawn")  # CUDA in each child, none in this process
    shared = {**vars(args), "mode": mode, "model_dir": model_dir, "owner_pid": owner}
    out, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    processes = []
    if mode == "shared":  # started and warmed here: every batch size the run's calls can make together
        warm = shared_engine(shared)
        for texts in range(1, args.clients * args.texts + args.query_clients + 1):
            for ids, lengths in workload(99 + texts, texts, 2):
                warm.forward_packed(ids, lengths)
    everyone = args.clients + args.query_clients
    for index in range(everyone):
        processes.append(ctx.Process(target=client, args=(index, shared, start, stop, out)))
        processes[-1].start()
    loading, ready = time.monotonic(), 0
    while ready < everyone:  # a client that cannot load (mps: no daemon's server) ends the run, not the benchmark
        try:
            out.get(timeout=5)
            ready += 1
        except queue.Empty:
            failed = [process.exitcode for process in processes if process.exitcode not in (None, 0)]
            if failed or time.monotonic() - loading > 600:
                for process in processes:
                    process.terminate()
                raise RuntimeError(
                    f"{mode}: {'a process exited ' + str(failed[0]) if failed else 'no start in 600 s'}"
                ) from None
    start.set()
    began = time.perf_counter()
    time.sleep(args.duration_s)
    # The daemon's servers while the clients run: none listed means they did not go through it.
    mps_servers = daemon.control("get_server_list") if daemon is not None else None
    stop.set()
    elapsed = time.perf_counter() - began
    done = [out.get(timeout=120) for _ in range(everyone)]
    for process in processes:
        process.join(timeout=60)

    def spread(query: bool) -> dict:
        latencies = np.array([x for item in done if item[1] == query for x in item[3]]) * 1000
        if not len(latencies):
            return {}
        return {
            "calls": len(latencies),
            "p50_ms": round(float(np.percentile(latencies, 50)), 3),
            "p99_ms": round(float(np.percentile(latencies, 99)), 3),
        }

    result = {
        "seq_per_s": round(sum(item[2] for item in done if not item[1]) / elapsed, 1),  # the stubs' calls
        **spread(False),
        "queries": spread(True),
        "max_abs_diff": max(item[4] for item in done),  # each client's first rows, again at the end
    }
    if mps_servers is not None:
        result["mps_servers"] = mps_servers
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shared_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="processes calling the engine (the served stubs)")
    parser.add_argument("--texts", type=int, nargs="+", default=[1, 8, 40], help="sequences a call, one run each")
    parser.add_argument("--host-us", type=float, default=300.0, help="busy CPU before each call (a stub's own work)")
    parser.add_argument("--query-clients", type=int, default=1, help="processes sending one-text queries beside them")
    parser.add_argument("--query-rate", type=float, default=50.0, help="queries a second from each")
    parser.add_argument("--modes", nargs="+", choices=("own", "mps", "shared"), default=["own", "mps", "shared"])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from bench.engine_workload import write_bert_base

    results = {"benchmark": "shared_engine", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "command": " ".join(["python -m bench.shared_engine", *(argv or sys.argv[1:])]), "runs": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="shared_engine_") as temporary:  # the model's 418 MB go with it
        folder = Path(temporary)
        model_dir = str(write_bert_base(folder / "model"))
        for texts in args.texts:
            for mode in args.modes:
                try:
                    found = run(mode, argparse.Namespace(**{**vars(args), "texts": texts}), model_dir, folder)
                except (RuntimeError, OSError, subprocess.SubprocessError) as error:  # mps: no daemon on this host
                    found = {"error": str(error)}
                results["runs"].append({"mode": mode, "texts": texts, **found})
                print(f"{mode:6} {args.clients} x {texts:4} texts: {found}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared_engine.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
