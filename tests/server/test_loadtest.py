"""Acceptance load tests: short bounded Locust runs against the real CPU server (loopback only), accepted and
rejected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Thresholds a 2-core machine meets with 2 users while it also runs Locust (measured: p99 ~45 ms, ~100 req/s).
LENIENT = ["--p50-ms", "1000", "--p99-ms", "2000", "--min-rps", "5", "--max-fail-ratio", "0"]


def loadtest(server, protocol: str, results: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    command = [sys.executable, "-m", "loadtest", "--url", url, "--protocol", protocol, "--users", "2"]
    command += ["--results", str(results), "--metrics-url", f"127.0.0.1:{server.ports.metrics}", *extra]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    report = results / "loadtest.json"
    return run, json.loads(report.read_text()) if report.is_file() else {}


def last_line(run: subprocess.CompletedProcess) -> str:
    return run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr


def check_accepted(run, result: dict, results: Path) -> None:
    assert run.returncode == 0, run.stdout + run.stderr
    assert last_line(run).startswith("ACCEPTED: "), run.stdout
    assert result["total"]["requests"] > 20 and result["total"]["failures"] == 0, result["total"]
    assert result["errors"] == []
    for name in ("locust_stats.csv", "locust_stats_history.csv", "report.html", "loadtest.png"):
        assert (results / name).stat().st_size > 0, name
    generator = result["load_generator"]
    assert generator["cpu_s"] > 0 and generator["test_cpu_s"] > 0 and generator["cpu_us_per_request"] > 0
    stages = result["server_stages"]
    # the server saw at least what the client counted (the stats reset after spawning; the server's did not)
    assert stages["ensemble"]["requests"] >= result["total"]["requests"]
    assert stages["ensemble"]["compute_infer_us"] > 0 and stages["ensemble"]["mean_batch"] >= 1
    assert result["server_metrics"]["ensemble"]["nv_inference_request_success"] >= result["total"]["requests"]


def test_grpc_closed_loop_is_accepted(server, tmp_path):
    """2 users split over 2 Locust worker processes (grpcio under gevent, after the fork), mixed batches."""
    run, result = loadtest(
        server, "grpc", tmp_path, "--duration", "8s", "--processes", "2", "--batch-mix", "1:3,4:1", *LENIENT
    )
    check_accepted(run, result, tmp_path)
    assert result["load_model"] == "closed" and result["users"] == 2
    assert len(result["load_generator_cpu_s"]["workers"]) == 2
    assert {entry["name"] for entry in result["requests"]} == {"ensemble x1", "ensemble x4"}
    assert 0.8 < result["littles_law"]["ratio"] <= 1.1, result["littles_law"]


def test_http_constant_throughput_is_accepted(server, tmp_path):
    """2 users at 10 requests/s each: the offered 20 req/s is what the server gets."""
    run, result = loadtest(
        server, "http", tmp_path, "--duration", "8s", "--load", "throughput", "--rate-per-user", "10", *LENIENT
    )
    check_accepted(run, result, tmp_path)
    assert result["load_model"] == "throughput"
    assert 15 <= result["total"]["rps"] <= 22, result["total"]
    assert result["requests"][0]["type"] == "POST" and result["requests"][0]["mean_bytes"] > 384 * 4


@pytest.mark.parametrize(
    ("protocol", "impossible", "reason"),
    [("grpc", ["--p99-ms", "0.001"], "p99 "), ("http", ["--min-rps", "1e9"], "req/s < 1e+09 req/s")],
)
def test_impossible_threshold_is_rejected(server, tmp_path, protocol, impossible, reason):
    bar = dict(zip(LENIENT[::2], LENIENT[1::2], strict=True)) | dict([impossible])
    run, result = loadtest(server, protocol, tmp_path, "--duration", "3s", *(x for kv in bar.items() for x in kv))
    assert run.returncode == 1, run.stdout + run.stderr
    line = last_line(run)
    assert line.startswith("REJECTED: ") and reason in line and "\n" not in line, line
    assert result["verdict"] == "REJECTED" and result["total"]["failures"] == 0
    assert len(result["breaches"]) == 1


def test_step_ramp_measures_each_step(server, tmp_path):
    run, result = loadtest(
        server,
        "grpc",
        tmp_path,
        *("--load", "ramp", "--step-start-users", "1", "--step-users", "1", "--step-max-users", "2"),
        *("--step-seconds", "3", "--step-keep-going"),
        *LENIENT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ramp, best step" in last_line(run)
    steps = result["steps"]
    assert [step["users"] for step in steps] == [1, 2]
    assert all(step["requests"] > 0 and step["rps"] > 0 and step["p99_ms"] >= step["p50_ms"] for step in steps)
    assert result["peak"] in steps and "step ramp" in run.stdout


def test_unreachable_server_is_rejected(tmp_path):
    command = [sys.executable, "-m", "loadtest", "--url", "127.0.0.1:1", "--protocol", "grpc", "--users", "1"]
    run = subprocess.run(
        [*command, "--duration", "2s", "--request-timeout", "1", "--results", str(tmp_path), *LENIENT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "REJECTED: fail ratio 1" in last_line(run), run.stdout + run.stderr
    assert "statistics API unavailable" in run.stdout
