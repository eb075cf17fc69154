"""python -m bench.tracing_cost: the throughput with [tracing] on against off, in one run.

Starts the real launcher with tracing off, then on (its endpoint an OTLP/HTTP receiver in this process,
bench/otlp_receiver.py, at --sample-rate), alternating --rounds times (off, on, off, on by default), so that
the noise between two servers of the same settings shows beside the difference. Each server is driven by the
routes of bench.api_cost at --concurrency after a warm-up: `api-base64` (/v1/embeddings, base64, one text per
request) and `grpc` (straight to tritonserver, whose own tracing samples those). Each phase's spans carry a
service name of its own (tracing.service_name), so the receiver's count says whose they are; every process
also has OTEL_EXPORTER_OTLP_ENDPOINT pointed at the receiver, so that a span exported while tracing is off,
through any OpenTelemetry default, would be counted too. The next server starts while the last one stops
(only a running server is measured). Writes tracing_cost.json and a summary, tracing_cost.txt, into --out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.api_cost import addresses, ensemble_stats, launcher_target, run_route, triton_requests
from bench.otlp_receiver import OtlpReceiver
from bench.record import header, write
from loadtest.corpus import load_text
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_settings

ROUTES = ("api-base64", "grpc")
BAR = 0.03  # tracing at a 1 % sample rate may cost at most 3 % of the throughput


def with_tracing(text: str, endpoint: str, sample_rate: float, service_name: str, triton_spans: bool = False) -> str:
    """A settings file's text with its [tracing] table (if it has one) replaced by one of these values."""
    kept, inside = [], False
    for line in text.splitlines():
        if line.startswith("["):  # a table's header (this project writes them at the line's start)
            inside = re.match(r"\[tracing\]", line) is not None
        if not inside:
            kept.append(line)
    table = f'[tracing]\nendpoint = "{endpoint}"\nsample_rate = {sample_rate}\nservice_name = "{service_name}"\n'
    table += f"triton_spans = {'true' if triton_spans else 'false'}\n"
    return "\n".join(kept) + "\n\n" + table


def phase_settings(
    source: Path, folder: Path, label: str, endpoint: str, sample_rate: float, triton_spans: bool = False
) -> Path:
    path = folder / f"{label}.toml"
    path.write_text(with_tracing(source.read_text(), endpoint, sample_rate, label, triton_spans))
    tracing = load_settings(path).tracing
    assert (tracing.endpoint, tracing.service_name) == (endpoint, label), tracing
    return path


def measure(pool, launcher: Launcher, args, texts: list[str], model: str) -> dict:
    """The routes on one server: a warm-up each, then one run each; and the requests Triton answered."""
    target = launcher_target(launcher, model, texts, args.processes)
    where = addresses(launcher.ports)
    warmed = {
        route: run_route(pool, target, route, where[route], args.concurrency, args.warmup_s) for route in args.routes
    }
    runs = {
        route: run_route(pool, target, route, where[route], args.concurrency, args.duration_s) for route in args.routes
    }
    sent = {route: warmed[route]["requests"] + runs[route]["requests"] for route in args.routes}
    return {"runs": runs, "requests_sent": sent, "triton_requests": triton_requests(ensemble_stats(target))[1]}


def spans_by_service(receiver: OtlpReceiver) -> tuple[Counter, Counter]:
    """(spans, traces) the receiver got, per service name."""
    with receiver.lock:
        spans = list(receiver.spans)
    traces = Counter(service for service, _ in {(span.service, span.trace_id) for span in spans})
    return Counter(span.service for span in spans), traces


def summarize(phases: list[dict], routes: list[str], spans: Counter, traces: Counter, sample_rate: float) -> dict:
    """Per route the throughput off and on, each on-phase's ratio to the off-phase before it, and the cost (one
    minus the mean on over the mean off); the spans of each phase and what tracing sampled."""
    summary: dict = {"routes": {}}
    for route in routes:
        off = [phase["runs"][route]["rps"] for phase in phases if not phase["tracing"]]
        on = [phase["runs"][route]["rps"] for phase in phases if phase["tracing"]]
        cost = 1 - statistics.mean(on) / statistics.mean(off)
        summary["routes"][route] = {
            "off_rps": off,
            "on_rps": on,
            "on_over_off": [round(b / a, 3) for a, b in zip(off, on, strict=True)],
            "off_spread": round((max(off) - min(off)) / statistics.mean(off), 3),
            "cost": round(cost, 4),
            "within_bar": cost <= BAR,
        }
    prefixes = {phase["label"] + "-": phase["tracing"] for phase in phases}  # services are <label>-api, ...
    on = tuple(prefix for prefix, traced in prefixes.items() if traced)
    summary["spans_while_off"] = sum(n for service, n in spans.items() if not service.startswith(on))
    summary["unattributed_services"] = sorted(s for s in spans if not s.startswith(tuple(prefixes)))
    for phase in phases:
        prefix, sent = phase["label"] + "-", phase["requests_sent"]
        phase["spans"] = {s.removeprefix(prefix): n for s, n in spans.items() if s.startswith(prefix)}
        phase["traces"] = {s.removeprefix(prefix): n for s, n in traces.items() if s.startswith(prefix)}
        if phase["tracing"]:  # the share of requests that were traced, beside the sample rate
            phase["sampled"] = {
                "api": round(phase["traces"].get("api", 0) / max(sent.get("api-base64", 0), 1), 4),
                "triton": round(phase["traces"].get("triton", 0) / max(phase["triton_requests"], 1), 4),
                "sample_rate": sample_rate,
            }
    return summary


def summary_text(record: dict) -> str:
    summary, phases = record["summary"], record["phases"]
    lines = [
        f"{record['date']} {record['machine']}; {record['settings']}; c={record['concurrency']}, "
        f"{record['duration_s']} s a run, sample rate {record['sample_rate']}",
        "phases: " + ", ".join(f"{p['label']} (ready in {p['ready_s']} s)" for p in phases),
    ]
    for route, result in summary["routes"].items():
        verdict = "within" if result["within_bar"] else "OVER"
        lines.append(
            f"{route}: off {result['off_rps']} rps, on {result['on_rps']} rps; on/off {result['on_over_off']}; "
            f"off-to-off spread {100 * result['off_spread']:.1f} %; cost {100 * result['cost']:.1f} % "
            f"({verdict} the {100 * BAR:.0f} % bar)"
        )
    for phase in phases:
        if phase["tracing"]:
            lines.append(f"{phase['label']}: spans {phase['spans']}, traced share {phase['sampled']}")
    lines.append(
        f"spans while tracing was off: {summary['spans_while_off']}"
        + (f"; services of no phase: {summary['unattributed_services']}" if summary["unattributed_services"] else "")
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", type=Path, help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2, help="load-generator processes")
    parser.add_argument("--duration-s", type=float, default=8.0, help="per route and phase")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="per route and phase, not counted")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of phases, tracing off then on")
    parser.add_argument("--sample-rate", type=float, default=0.01)
    parser.add_argument("--triton-spans", action="store_true", help="tracing.triton_spans in the traced phases")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    settings = load_settings(args.settings)
    texts = load_text()
    args.out.mkdir(parents=True, exist_ok=True)
    receiver = OtlpReceiver()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url  # what any default exporter would send to
    phases: list[dict] = []
    stopping: Launcher | None = None
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tracing_cost.") as folder,
            multiprocessing.get_context("spawn").Pool(args.processes) as pool,
        ):
            for index in range(2 * args.rounds):
                traced = index % 2 == 1
                label = f"tracing-{'on' if traced else 'off'}-{index // 2 + 1}"
                endpoint = receiver.url if traced else ""
                path = phase_settings(settings.path, Path(folder), label, endpoint, args.sample_rate, args.triton_spans)
                started = time.monotonic()
                log = args.out / "tracing_cost_launcher.log"
                launcher = Launcher(path, settings.repository_dir, Ports.free(), log).start()
                ready_s = round(time.monotonic() - started, 1)
                if stopping is not None:
                    stopping.process.wait(timeout=120)
                try:
                    result = measure(pool, launcher, args, texts, settings.model.name)
                finally:
                    launcher.terminate()
                    stopping = launcher
                phases.append({"label": label, "tracing": traced, "ready_s": ready_s, **result})
                print(label, {route: run["rps"] for route, run in result["runs"].items()}, flush=True)
            stopping.process.wait(timeout=120)
            stopping = None
    finally:
        if stopping is not None:
            stopping.kill()
        time.sleep(1.0)  # an export the last server sent as it ended
        spans, traces = spans_by_service(receiver)
        receiver.stop()
    record = {
        **header("tracing_cost", argv),
        "settings": str(settings.path),
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "sample_rate": args.sample_rate,
        "triton_spans": args.triton_spans,
        "note": "a server per phase, phases alternate tracing off and on; load generators share the machine",
        "phases": phases,
        "spans_by_service": dict(spans),
        "summary": summarize(phases, args.routes, spans, traces, args.sample_rate),
    }
    write(args.out, record)
    text = summary_text(record)
    (args.out / "tracing_cost.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
