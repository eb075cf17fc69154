"""python -m loadtest: the acceptance load test of a deployment, headless, with a verdict and its exit code.

Runs Locust (loadtest/locustfile.py) in a child process against --url, then prints where the time went
inside Triton (statistics API deltas over the run, and metrics with --metrics-url) and the verdict.
Exit code 0: accepted; 1: a threshold was breached (the last line says which); 2: the test could not run.

Load models (--load):
  closed      --users users, each sending its next request as soon as the last one is answered (the bar's
              numbers are measured this way: by Little's law, 200 users at p99 <= 30 ms imply >= 6.7k req/s)
  throughput  --users users at --rate-per-user requests/s each (Locust's constant_throughput): a fixed
              offered load, so latency is measured without the closed loop slowing the senders down
  ramp        add --step-users every --step-seconds up to --step-max-users, stop past the knee; accepted
              when some step met the latency bar at >= --min-rps

Writes into --results: locust_stats*.csv, report.html (Locust), loadtest.png, locust_summary.json,
loadtest.json (everything, with the load generator's own CPU time) and locust.log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from loadtest import report, triton_stats
from loadtest.acceptance import LOAD_MODELS, Thresholds, format_mix, parse_duration, parse_mix
from settings import ROOT, SettingsError, load_settings

HERE = Path(__file__).resolve().parent
LOCUSTFILE = HERE / "locustfile.py"
STEP_SHAPE = HERE / "step_shape.py"
USER_CLASSES = {"grpc": "GrpcTextUser", "http": "HttpTextUser"}


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", help="settings file whose [loadtest] section is the bar (default: the repo's)")
    parser.add_argument("--url", help="HOST:PORT of the protocol's endpoint (default: from the settings)")
    parser.add_argument("--protocol", choices=tuple(USER_CLASSES), help="default: loadtest.protocol")
    parser.add_argument("--load", choices=LOAD_MODELS, default="closed", help="load model (default: closed)")
    parser.add_argument("--users", type=int, help="users (default: loadtest.users)")
    parser.add_argument("--duration", help="run time, e.g. 30s, 2m (default: loadtest.duration_s)")
    parser.add_argument("--spawn-rate", type=float, help="users started per second (default: all within 1 s)")
    parser.add_argument("--rate-per-user", type=float, default=1.0, help="requests/s per user with --load throughput")
    parser.add_argument("--batch-mix", help="SIZE:WEIGHT,... e.g. 1:3,8:1 (default: loadtest.batch_sizes/weights)")
    parser.add_argument("--model", default="ensemble", help="Triton model to call")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--processes", type=int, default=0, help="Locust worker processes (-1: one per core)")
    parser.add_argument("--p50-ms", type=float, help="acceptance: p50 at most (default: loadtest.p50_ms)")
    parser.add_argument("--p99-ms", type=float, help="acceptance: p99 at most (default: loadtest.p99_ms)")
    parser.add_argument("--min-rps", type=float, help="acceptance: requests/s at least (default: loadtest.min_rps)")
    parser.add_argument("--max-fail-ratio", type=float, help="acceptance: failed share at most")
    parser.add_argument("--step-users", type=int, default=8, help="ramp: users added per step")
    parser.add_argument("--step-start-users", type=int, default=0, help="ramp: users of the first step")
    parser.add_argument("--step-max-users", type=int, default=256, help="ramp: last step at most")
    parser.add_argument("--step-seconds", type=float, default=15.0, help="ramp: length of a step")
    parser.add_argument("--knee-scaling", type=float, default=0.5, help="ramp: share of linear gain below = knee")
    parser.add_argument("--step-keep-going", action="store_true", help="ramp: climb past the knee to the top")
    parser.add_argument("--metrics-url", help="HOST:PORT of Triton's metrics endpoint, read before and after")
    parser.add_argument("--no-server-stats", action="store_true", help="skip Triton's statistics API")
    parser.add_argument("--results", type=Path, help="output folder (default: build/loadtest/<UTC time>)")
    return parser.parse_args(argv)


def locust_command(args, settings_path: Path, url: str, mix: str, bar: Thresholds, results: Path) -> list[str]:
    files = f"{LOCUSTFILE},{STEP_SHAPE}" if args.load == "ramp" else str(LOCUSTFILE)
    host = url if args.protocol.startswith("grpc") or "://" in url else f"http://{url}"
    command = [
        *(sys.executable, "-m", "locust", "-f", files, "--headless", "--host", host),
        *("--csv", str(results / "locust"), "--csv-full-history", "--html", str(results / "report.html")),
        *("--only-summary", "--stop-timeout", str(max(5, int(args.request_timeout))), "--loglevel", "INFO"),
        *("--settings", str(settings_path), "--triton-model", args.model, "--batch-mix", mix),
        *("--request-timeout", str(args.request_timeout), "--summary-json", str(results / "locust_summary.json")),
        *("--accept-p50-ms", repr(bar.p50_ms), "--accept-p99-ms", repr(bar.p99_ms)),
        *("--accept-min-rps", repr(bar.min_rps), "--accept-max-fail-ratio", repr(bar.max_fail_ratio)),
    ]
    if args.load == "ramp":
        command += [
            *("--step-users", str(args.step_users), "--step-start-users", str(args.step_start_users)),
            *("--step-max-users", str(args.step_max_users), "--step-seconds", repr(args.step_seconds)),
            *("--knee-scaling", repr(args.knee_scaling)),
            *(["--step-keep-going"] if args.step_keep_going else []),
        ]
    else:
        spawn_rate = args.spawn_rate or max(1, args.users)
        command += ["-u", str(args.users), "-r", repr(float(spawn_rate)), "-t", f"{args.duration_s:g}s"]
        command += ["--reset-stats"]  # the verdict covers the run after every user started
        if args.load == "throughput":
            command += ["--rate-per-user", repr(args.rate_per_user)]
    if args.processes:
        command += ["--processes", str(args.processes)]
    return [*command, USER_CLASSES[args.protocol]]


def time_limit(args) -> float:
    """Seconds the Locust child may take before it is stopped: its own run time plus start and stop."""
    if args.load == "ramp":
        start = args.step_start_users or args.step_users
        steps = max(1, (args.step_max_users - start) // max(1, args.step_users) + 1)
        return steps * args.step_seconds + 60 + args.request_timeout
    return args.duration_s + 60 + args.request_timeout


def server_snapshot(args, url: str) -> tuple[dict | None, dict | None, list[str]]:
    stats = metrics = None
    notes = []
    if not args.no_server_stats:
        try:
            client = triton_stats.statistics_client(url, "http" if args.protocol == "http" else "grpc")
            try:
                stats = triton_stats.model_stats(client)
            finally:
                client.close()
        except Exception as exc:  # a deployment may not expose the statistics API: report without it
            notes.append(f"statistics API unavailable at {url}: {exc}")
    if args.metrics_url:
        try:
            metrics = triton_stats.scrape_metrics(args.metrics_url)
        except Exception as exc:
            notes.append(f"metrics unavailable at {args.metrics_url}: {exc}")
    return stats, metrics, notes


def run_locust(command: list[str], log_path: Path, limit_s: float) -> tuple[int, float, float]:
    """(exit code, wall seconds, CPU seconds of Locust and its worker processes, user + system)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            code = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            process.terminate()  # Locust handles SIGTERM: stops the users and writes its reports
            try:
                code = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_generator(processes: int, wall_s: float, cpu_s: float, summary: dict, requests: int) -> dict:
    """The load generator's own CPU cost: the whole Locust child (start-up included) and the test alone."""
    during = summary.get("load_generator_cpu_s", {})
    test_cpu = during.get("during_test")
    test_wall = summary.get("test_wall_s")
    return {
        "processes": processes,
        "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2),
        "test_cpu_s": test_cpu,
        "test_wall_s": test_wall,
        "cores_busy": round(test_cpu / test_wall, 2) if test_cpu and test_wall else round(cpu_s / wall_s, 2),
        "cpu_us_per_request": round((test_cpu or cpu_s) / requests * 1e6, 1) if requests else None,
        "note": "cpu_s: Locust and its workers, user + system (getrusage of the waited child), start-up included; "
        "test_cpu_s: the same processes between test_start and test_stop (time.process_time)",
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = load_settings(args.settings)
        load = settings.loadtest
        args.protocol = args.protocol or load.protocol
        args.users = args.users or load.users
        args.duration_s = parse_duration(args.duration) if args.duration else load.duration_s
        sizes, weights = parse_mix(args.batch_mix) if args.batch_mix else (load.batch_sizes, load.batch_weights)
        mix = format_mix(sizes, weights)
    except (SettingsError, ValueError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    if args.users < 1 or args.duration_s <= 0 or (args.load == "throughput" and args.rate_per_user <= 0):
        print("loadtest: --users, --duration and --rate-per-user must be positive", file=sys.stderr)
        return 2
    bar = Thresholds.resolve(
        load, p50_ms=args.p50_ms, p99_ms=args.p99_ms, min_rps=args.min_rps, max_fail_ratio=args.max_fail_ratio
    )
    server = settings.server
    url = args.url or f"{server.host}:{server.http_port if args.protocol == 'http' else server.grpc_port}"
    url = url.removeprefix("grpc://").removeprefix("http://").rstrip("/")  # HOST:PORT for Locust and the stats
    results = args.results or ROOT / "build" / "loadtest" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results.mkdir(parents=True, exist_ok=True)
    for stale in ("locust_summary.json", "loadtest.json", "loadtest.png"):
        (results / stale).unlink(missing_ok=True)
    command = locust_command(args, settings.path, url, mix, bar, results)

    stats_before, metrics_before, notes = server_snapshot(args, url)
    print(f"loadtest: {args.load} load, {args.protocol} {url}, results in {results}", flush=True)
    code, wall_s, cpu_s = run_locust(command, results / "locust.log", time_limit(args))
    stats_after, metrics_after, notes_after = server_snapshot(args, url)
    notes += [note for note in notes_after if note not in notes]

    summary_path = results / "locust_summary.json"
    if not summary_path.is_file():
        tail = (results / "locust.log").read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        print(f"ERROR: Locust exited with {code} before reporting (see {results / 'locust.log'})", file=sys.stderr)
        return 2
    summary = json.loads(summary_path.read_text())
    stages = triton_stats.stage_breakdown(stats_before, stats_after) if stats_before and stats_after else {}
    requests = summary["total"]["requests"]
    result = {
        "benchmark": "loadtest",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu_cores": os.cpu_count(), "platform": platform.platform(), "cpu": cpu_model()},
        "command": shlex.join(["python", "-m", "loadtest", *(argv if argv is not None else sys.argv[1:])]),
        "locust_command": shlex.join(command),
        "url": url,
        "protocol": args.protocol,
        "settings": str(settings.path),
        "locust_exit_code": code,
        **summary,
        "load_generator": load_generator(args.processes, wall_s, cpu_s, summary, requests),
        "server_stages": stages,
        "server_metrics": triton_stats.metrics_delta(metrics_before, metrics_after)
        if metrics_before and metrics_after
        else {},
        "notes": notes,
    }
    history = results / "locust_stats_history.csv"
    if history.is_file():
        png = report.plot(
            report.read_history(history),
            results / "loadtest.png",
            f"{args.protocol} {url}, {args.load} load\n{summary['verdict_line']}",
            bar.p50_ms,
            bar.p99_ms,
            summary.get("steps"),
        )
        result["png"] = str(png) if png else None
    (results / "loadtest.json").write_text(json.dumps(result, indent=2) + "\n")

    print_summary(result)
    verdict = summary["verdict_line"]
    if summary["verdict"] == "ACCEPTED" and code != 0:
        verdict = f"REJECTED: Locust exited with {code} (see {results / 'locust.log'}) [{verdict}]"
    print(verdict, flush=True)
    return 0 if verdict.startswith("ACCEPTED") else 1


def print_summary(result: dict) -> None:
    for entry in result["requests"]:
        print(
            f"  {entry['type']:<5}{entry['name']:<22}{entry['requests']:>8} req {entry['failures']:>6} failed "
            f"{entry['rps']:>9.1f} req/s  p50 {entry['p50_ms']:>5g}  p90 {entry['p90_ms']:>5g}  "
            f"p99 {entry['p99_ms']:>5g} ms"
        )
    for error in result["errors"][:5]:
        print(f"  error x{error['occurrences']}: {error['name']}: {error['error'][:200]}")
    if result.get("steps") is not None:
        print("step ramp (each step after it settled):")
        print("\n".join("  " + line for line in report.step_lines(result["steps"], result.get("knee"))))
        peak = result.get("peak")
        if peak:
            print(f"  peak: {peak['rps']:.1f} req/s at {peak['users']} users (p99 {peak['p99_ms']:g} ms)")
    if result["server_stages"]:
        print("inside Triton over the run, ms per request (statistics API):")
        print("\n".join("  " + line for line in triton_stats.format_breakdown(result["server_stages"])))
        ensemble = result["server_stages"].get("ensemble")
        mean_ms = result["total"].get("mean_ms") or 0
        if ensemble and mean_ms:
            inside = ensemble.get("request_us", 0) / 1e3
            print(f"  client mean {mean_ms:.2f} ms, of which {inside:.2f} ms inside the server")
    for model, values in result["server_metrics"].items():
        if model == "server":
            print("  metrics at the end: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
        elif values.get("nv_inference_request_failure"):
            print(f"  metrics: {model} {values['nv_inference_request_failure']:g} failed requests over the run")
    generator = result["load_generator"]
    print(
        f"load generator: {generator['test_cpu_s']} CPU s during the test ({generator['cpu_s']} with start-up) "
        f"= {generator['cores_busy']} cores busy, {generator['cpu_us_per_request']} us CPU per request"
    )
    processes = generator["processes"] if generator["processes"] >= 0 else os.cpu_count() or 1
    if (generator["cores_busy"] or 0) > 0.85 * max(1, processes):
        print("  the load generator kept its cores busy: it may limit the load; try --processes N")
    little = result.get("littles_law")
    if little:
        print(
            f"Little's law: {result['users']} users / {result['total']['mean_ms']} ms mean = "
            f"{little['expected_rps']} req/s expected, measured x{little['ratio']}"
        )
        if little["ratio"] < 0.9:
            print("  the users spend time between requests: the load generator may be the bottleneck")
    for note in result["notes"]:
        print(f"note: {note}")
