"""Locust users for a served text model (an embedder, a classifier, or a reranker: its texts scored against one
query), and the acceptance verdict at the end of the run.

    locust -f loadtest/locustfile.py --headless --host 127.0.0.1:8001 -u 8 -t 30s GrpcTextUser
    locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8000 -u 8 -t 30s HttpTextUser

(`python -m loadtest` runs this for you and adds the reports.) Each request carries texts drawn from
loadtest/corpus.txt; `--batch-mix 1:3,8:1` sends three single-text requests for each batch of eight.
Users run a closed loop without think time, or at `--rate-per-user` requests/s each (Locust's
constant_throughput). At the end, the run is held to the acceptance bar (the settings' [loadtest] section,
or --accept-* flags): a breach sets the exit code to 1 and logs one line saying why.

gRPC under gevent: grpcio blocks the whole process in its own C core unless
`grpc.experimental.gevent.init_gevent()` ran before any channel exists; the gRPC user calls it (once per
process, after Locust forked its --processes workers) before opening the process's channel.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import ClassVar

import grpc
from locust import FastHttpUser, User, constant, constant_throughput, events, task
from locust.runners import WorkerRunner
from tritonclient.grpc import service_pb2

from common.contract import QUERY_INPUT, TEXT_INPUT
from loadtest.acceptance import (
    Measured,
    Thresholds,
    best_step,
    breaches,
    find_knee,
    parse_mix,
    ramp_breaches,
    verdict_line,
)
from loadtest.corpus import load_text
from protocol.api_key import api_key, headers
from protocol.kserve_grpc import MODEL_INFER, encode_texts, tensors_infer_request
from settings import load_settings

# The API key of the environment, sent with every request when the server asks for one (protocol/api_key.py).
KEY_HEADERS = headers(api_key())
KEY_METADATA = tuple(headers(api_key(), "grpc").items()) or None

log = logging.getLogger("loadtest")
TEXTS = load_text()
# Filled from the command line when Locust fires `init`; the users read it.
CONFIG: dict = {"model": "ensemble", "sizes": (1,), "weights": (1.0,), "timeout_s": 30.0, "query": None}
# A reranker's load: every text of a request is scored against this query (the settings' model.task says so).
QUERY = "How does Triton batch requests of different lengths?"
# CPU seconds (user + system, all threads) this process spent between test_start and test_stop, and
# what each worker process reported for itself.
CPU: dict = {"start": None, "self": None, "workers": {}, "wall_start": None, "wall": None}
_grpc_ready = False


def init_grpc_gevent() -> None:
    """Make grpcio cooperate with gevent in this process; must run before the first channel is created."""
    global _grpc_ready
    if not _grpc_ready:
        from grpc.experimental import gevent as grpc_gevent

        grpc_gevent.init_gevent()
        _grpc_ready = True


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    group = parser.add_argument_group("BERT on Triton", "texts, load model and acceptance bar (loadtest/)")
    group.add_argument("--settings", default=None, help="settings file with the [loadtest] bar")
    group.add_argument("--triton-model", default="ensemble", help="model to call (default: ensemble)")
    group.add_argument("--batch-mix", default=None, help="SIZE:WEIGHT,... texts per request (default: settings)")
    group.add_argument(
        "--rate-per-user", type=float, default=0.0, help="requests/s per user (constant_throughput); 0: closed loop"
    )
    group.add_argument("--request-timeout", type=float, default=30.0, help="seconds per request")
    group.add_argument("--text-seed", type=int, default=2026, help="where each user starts in the corpus")
    for name in ("p50-ms", "p99-ms", "min-rps", "max-fail-ratio"):
        group.add_argument(f"--accept-{name}", type=float, default=None, help="acceptance bar (default: settings)")
    group.add_argument("--summary-json", default="", help="write the verdict and the numbers here")
    ramp = parser.add_argument_group("Step ramp (loadtest/step_shape.py)")
    ramp.add_argument("--step-start-users", type=int, default=0, help="users of the first step (default: step)")
    ramp.add_argument("--step-users", type=int, default=8, help="users added per step")
    ramp.add_argument("--step-max-users", type=int, default=256)
    ramp.add_argument("--step-seconds", type=float, default=15.0, help="length of one step")
    ramp.add_argument("--knee-scaling", type=float, default=0.5, help="a step below this share of linear gain")
    ramp.add_argument("--step-keep-going", action="store_true", help="climb to the top even past the knee")


def thresholds(options) -> Thresholds:
    load = load_settings(getattr(options, "settings", None)).loadtest
    return Thresholds.resolve(
        load,
        p50_ms=getattr(options, "accept_p50_ms", None),
        p99_ms=getattr(options, "accept_p99_ms", None),
        min_rps=getattr(options, "accept_min_rps", None),
        max_fail_ratio=getattr(options, "accept_max_fail_ratio", None),
    )


@events.init.add_listener
def _configure(environment, **_) -> None:
    options = environment.parsed_options
    settings = load_settings(getattr(options, "settings", None))
    load = settings.loadtest
    mix = getattr(options, "batch_mix", None)
    sizes, weights = parse_mix(mix) if mix else (load.batch_sizes, load.batch_weights)
    CONFIG.update(
        model=getattr(options, "triton_model", "ensemble"),
        sizes=sizes,
        weights=weights,
        timeout_s=getattr(options, "request_timeout", 30.0),
        rng=random.Random(getattr(options, "text_seed", 2026)),
        rate_per_user=getattr(options, "rate_per_user", 0.0) or 0.0,
        query=QUERY if settings.model.task == "rerank" else None,
    )
    rate = CONFIG["rate_per_user"]
    for cls in (GrpcTextUser, HttpTextUser):
        cls.wait_time = constant_throughput(rate) if rate > 0 else constant(0)
    HttpTextUser.network_timeout = HttpTextUser.connection_timeout = CONFIG["timeout_s"]


@events.test_start.add_listener
def _cpu_start(environment, **_) -> None:
    CPU["start"], CPU["wall_start"] = time.process_time(), time.perf_counter()


# Workers put their CPU seconds so far into every stats report (every few seconds and a last one when they
# stop); the master keeps the latest per worker. A message sent at test_stop would race the master's exit.
@events.report_to_master.add_listener
def _cpu_report(client_id, data, **_) -> None:
    if CPU["start"] is not None:
        data["loadtest_cpu_s"] = round(time.process_time() - CPU["start"], 3)


@events.worker_report.add_listener
def _cpu_collect(client_id, data, **_) -> None:
    if "loadtest_cpu_s" in data:
        CPU["workers"][client_id] = data["loadtest_cpu_s"]


@events.test_stop.add_listener
def _cpu_stop(environment, **_) -> None:
    if CPU["start"] is not None and not isinstance(environment.runner, WorkerRunner):
        CPU["self"] = round(time.process_time() - CPU["start"], 3)
        CPU["wall"] = round(time.perf_counter() - CPU["wall_start"], 3)


def desynchronize() -> None:
    """Under constant_throughput, start each user at a random phase of its period: users spawned together
    would otherwise send in lockstep, and the server would see bursts instead of the offered rate."""
    rate = CONFIG.get("rate_per_user", 0.0)
    if rate > 0:
        time.sleep(random.uniform(0, 1 / rate))  # gevent-patched: yields to the other users


class TextSource:
    """Per user: a start in the corpus, then consecutive texts; the batch size drawn from the mix."""

    def __init__(self) -> None:
        rng = CONFIG.get("rng") or random.Random()
        self._next = rng.randrange(len(TEXTS))
        self._rng = random.Random(rng.random())

    def batch(self) -> list[str]:
        size = self._rng.choices(CONFIG["sizes"], CONFIG["weights"])[0]
        start, self._next = self._next, (self._next + size) % len(TEXTS)
        return [TEXTS[(start + i) % len(TEXTS)] for i in range(size)]


def request_name(size: int) -> str:
    return f"{CONFIG['model']} x{size}"


def row_problem(shapes: list[list[int]], size: int) -> str | None:
    """Why the outputs do not answer `size` texts (every output's first dimension), or None."""
    if not shapes:
        return "no outputs in the response"
    wrong = [shape for shape in shapes if not shape or int(shape[0]) != size]
    return f"outputs shaped {wrong} for {size} texts" if wrong else None


def grpc_method(cache: dict, host: str):
    """This process's ModelInfer callable on one channel to host, made once: requests go as the bytes they are,
    answers are parsed by protobuf alone."""
    if host not in cache:
        channel = grpc.insecure_channel(host, options=[("grpc.max_receive_message_length", 1 << 30)])
        answer = service_pb2.ModelInferResponse
        cache[host] = channel.unary_unary(MODEL_INFER, response_deserializer=answer.FromString)
    return cache[host]


class GrpcTextUser(User):
    """Raw KServe gRPC ModelInfer calls, every one reported to Locust with its real timing.

    The load generator must cost far less than the server it measures, and on one host it shares the cores:
    the users of a process share one channel (HTTP/2 multiplexes their calls), each request is serialized
    once per distinct batch of texts and reused, and the response is parsed by protobuf alone."""

    wait_time = constant(0)
    # Per process (Locust forks its workers before users start): host -> the ModelInfer callable on the one
    # channel, and (model, texts) -> the serialized request (bounded: corpus positions x batch sizes).
    _calls: ClassVar[dict] = {}
    _requests: ClassVar[dict] = {}

    def on_start(self) -> None:
        init_grpc_gevent()
        host = (self.host or "").removeprefix("grpc://")
        if not host:
            raise ValueError("no host: pass --host HOST:PORT of Triton's gRPC endpoint")
        self._infer = grpc_method(self._calls, host)
        self._texts = TextSource()
        desynchronize()

    @task
    def infer(self) -> None:
        texts = self._texts.batch()
        key = (CONFIG["model"], tuple(texts))
        request = self._requests.get(key)
        if request is None:
            inputs = {TEXT_INPUT: encode_texts(texts)}
            if CONFIG["query"] is not None:
                inputs = {QUERY_INPUT: encode_texts([CONFIG["query"]] * len(texts)), **inputs}
            request = self._requests[key] = tensors_infer_request(CONFIG["model"], inputs)
        length, error = 0, None
        started = time.perf_counter()
        try:
            response = self._infer(request, timeout=CONFIG["timeout_s"], metadata=KEY_METADATA)
            elapsed_ms = (time.perf_counter() - started) * 1e3
            length = response.ByteSize()
            problem = row_problem([list(output.shape) for output in response.outputs], len(texts))
            error = ValueError(problem) if problem else None
        except Exception as exc:  # every failure is a failed request in the report, never a dead user
            elapsed_ms = (time.perf_counter() - started) * 1e3
            error = exc
        self.environment.events.request.fire(
            request_type="grpc",
            name=request_name(len(texts)),
            response_time=elapsed_ms,
            response_length=length,
            response=None,
            context={},
            exception=error,
        )


class HttpTextUser(FastHttpUser):
    """KServe v2 JSON over HTTP/1.1 to /v2/models/<model>/infer (Locust's FastHttpUser, one connection)."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self._texts = TextSource()
        desynchronize()

    @task
    def infer(self) -> None:
        texts = self._texts.batch()
        inputs = [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]
        if CONFIG["query"] is not None:
            shape = [len(texts), 1]
            inputs.append(
                {"name": QUERY_INPUT, "datatype": "BYTES", "shape": shape, "data": [CONFIG["query"]] * len(texts)}
            )
        body = {"inputs": inputs}
        with self.client.post(
            f"/v2/models/{CONFIG['model']}/infer",
            data=json.dumps(body),
            headers={"Content-Type": "application/json", **KEY_HEADERS},
            name=request_name(len(texts)),
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                detail = getattr(response, "error", None) or (response.text or "")[:200]
                response.failure(f"HTTP {response.status_code}: {detail}")
                return
            try:
                problem = row_problem([output["shape"] for output in response.json()["outputs"]], len(texts))
            except (ValueError, KeyError, TypeError) as exc:
                problem = f"unreadable response: {exc}"
            if problem:
                response.failure(problem)
            else:
                response.success()


def measured(environment) -> Measured:
    total = environment.stats.total
    return Measured(
        requests=total.num_requests,
        failures=total.num_failures,
        rps=round(total.total_rps, 2),
        p50_ms=total.get_response_time_percentile(0.5) if total.num_requests else 0.0,
        p99_ms=total.get_response_time_percentile(0.99) if total.num_requests else 0.0,
        mean_ms=round(total.avg_response_time, 2),
    )


def step_measured(step: dict) -> Measured:
    return Measured(step["requests"], step["failures"], step["rps"], step["p50_ms"], step["p99_ms"], step["mean_ms"])


def entry_summary(entry) -> dict:
    has = entry.num_requests > 0
    return {
        "type": entry.method,
        "name": entry.name,
        "requests": entry.num_requests,
        "failures": entry.num_failures,
        "rps": round(entry.total_rps, 2),
        "mean_ms": round(entry.avg_response_time, 2),
        **{f"p{p}_ms": entry.get_response_time_percentile(p / 100) if has else 0 for p in (50, 90, 99)},
        "max_ms": round(entry.max_response_time, 2),
        "mean_bytes": round(entry.avg_content_length, 1),
    }


def load_model(environment) -> str:
    if environment.shape_class is not None:
        return "ramp"
    rate = getattr(environment.parsed_options, "rate_per_user", 0.0) or 0.0
    return "throughput" if rate > 0 else "closed"


@events.quitting.add_listener
def _verdict(environment, **_) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return  # the master (or the local runner) holds the aggregated numbers
    options = environment.parsed_options
    bar, run, model = thresholds(options), measured(environment), load_model(environment)
    shape = environment.shape_class
    steps = shape.finish(environment) if shape is not None and hasattr(shape, "finish") else None
    if steps is None:
        reasons = breaches(bar, run)
        line = verdict_line(reasons, run, model)
    else:
        reasons = ramp_breaches(bar, steps, run)
        best = best_step(bar, steps)
        if best is None:
            line = verdict_line(reasons, run, "ramp")
        else:
            line = verdict_line(reasons, step_measured(steps[best]), f"ramp, best step: {steps[best]['users']} users")
    environment.process_exit_code = 1 if reasons else 0
    (log.error if reasons else log.info)(line)
    path = getattr(options, "summary_json", "")
    if not path:
        return
    users = getattr(options, "num_users", None)
    summary = {
        "verdict": "REJECTED" if reasons else "ACCEPTED",
        "verdict_line": line,
        "breaches": reasons,
        "thresholds": bar.__dict__,
        "load_model": model,
        "users": users if model != "ramp" else None,
        "rate_per_user": getattr(options, "rate_per_user", 0.0),
        "batch_mix": {"sizes": list(CONFIG["sizes"]), "weights": list(CONFIG["weights"])},
        "model": CONFIG["model"],
        "total": {**run.__dict__, "fail_ratio": round(run.fail_ratio, 6) if run.requests else None},
        "requests": [entry_summary(e) for e in environment.stats.entries.values()],
        "errors": [
            {"type": e.method, "name": e.name, "error": str(e.error), "occurrences": e.occurrences}
            for e in environment.stats.errors.values()
        ],
        "workers": getattr(options, "processes", 0) or 0,
        "test_wall_s": CPU["wall"],
        "load_generator_cpu_s": {
            "during_test": round((CPU["self"] or 0.0) + sum(CPU["workers"].values()), 3),
            "this_process": CPU["self"],
            "workers": sorted(CPU["workers"].values()),
        },
        "percentile_resolution_ms": "1 below 100 ms (Locust rounds response times to 2 significant digits)",
    }
    if model == "closed" and users and run.mean_ms > 0:
        # Little's law for a closed loop without think time: throughput = users / mean response time.
        expected = users / (run.mean_ms / 1e3)
        summary["littles_law"] = {"expected_rps": round(expected, 1), "ratio": round(run.rps / expected, 3)}
    if steps is not None:
        knee, best = find_knee(steps, getattr(options, "knee_scaling", 0.5)), best_step(bar, steps)
        summary["steps"] = steps
        summary["knee"] = steps[knee] if knee is not None else None
        summary["peak"] = max(steps, key=lambda step: step["rps"]) if steps else None
        summary["best_within_bar"] = steps[best] if best is not None else None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=2) + "\n")
