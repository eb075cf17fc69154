"""Acceptance load tests: short bounded Locust runs against the real CPU server (loopback only), and the
verdict logic, knee finder, settings section and statistics helpers on their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest import triton_stats
from loadtest.acceptance import (
    Measured,
    Thresholds,
    breaches,
    find_knee,
    parse_duration,
    parse_mix,
    ramp_breaches,
    verdict_line,
)
from settings import SettingsError, load_settings

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


# Logic on its own: no server, no Locust process.

BAR = Thresholds(p50_ms=15, p99_ms=30, min_rps=6700, max_fail_ratio=0.0)


def test_breaches_name_every_threshold():
    good = Measured(requests=10_000, failures=0, rps=7000, p50_ms=12, p99_ms=29)
    assert breaches(BAR, good) == []
    assert verdict_line([], good, "closed").startswith("ACCEPTED: 7000.0 req/s")
    bad = Measured(requests=100, failures=1, rps=90, p50_ms=16, p99_ms=31)
    reasons = breaches(BAR, bad)
    assert len(reasons) == 4 and reasons[0].startswith("fail ratio 0.0100")
    line = verdict_line(reasons, bad, "closed")
    assert line.startswith("REJECTED: fail ratio") and "p99 31 ms > 30 ms" in line and "\n" not in line
    assert breaches(BAR, Measured(0, 0, 0, 0, 0)) == ["no request completed"]


def test_thresholds_come_from_settings_unless_overridden():
    load = load_settings().loadtest
    assert Thresholds.resolve(load).p99_ms == load.p99_ms
    bar = Thresholds.resolve(load, p99_ms=0.001, min_rps=None)
    assert bar.p99_ms == 0.001 and bar.min_rps == load.min_rps


def step(users, rps, p99=10, p50=5, requests=100, failures=0):
    return {"users": users, "rps": rps, "p50_ms": p50, "p99_ms": p99, "requests": requests, "failures": failures}


def test_knee_is_where_throughput_stops_following_users():
    linear = [step(8, 800), step(16, 1590), step(24, 2390)]
    assert find_knee(linear) is None
    saturating = [*linear, step(32, 2600), step(40, 2650)]
    assert find_knee(saturating) == 2  # 24 -> 32 users (+33 %) gave +9 %: the knee is 24 users
    steps = [step(8, 800, p99=12), step(16, 1500, p99=25), step(24, 2000, p99=45)]
    assert ramp_breaches(Thresholds(15, 30, 1000, 0), steps, Measured(300, 0, 1400, 10, 40)) == []
    reasons = ramp_breaches(Thresholds(15, 30, 1600, 0), steps, Measured(300, 0, 1400, 10, 40))
    assert reasons == ["best step within the latency bar (16 users) gave 1500.0 req/s < 1600 req/s"]


def test_mix_and_duration_parsing():
    assert parse_mix("1:3, 8:1") == ((1, 8), (3.0, 1.0))
    assert parse_mix("4") == ((4,), (1.0,))
    assert parse_duration("30s") == 30 and parse_duration("2m") == 120 and parse_duration("1h30m") == 5400
    assert parse_duration("12") == 12
    for bad in ("0:1", "1:0", ""):
        with pytest.raises(ValueError):
            parse_mix(bad)
    with pytest.raises(ValueError):
        parse_duration("30x")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('protocol = "grpc"', 'protocol = "udp"', "loadtest.protocol"),
        ("batch_weights = [1]", "batch_weights = [1, 2]", "one weight per"),
        ("batch_sizes = [1]", "batch_sizes = [1024]", "batch_sizes must lie"),
        ("p50_ms = 100.0", "p50_ms = 900.0", "p50_ms <= p99_ms"),
        ("max_fail_ratio = 0.0", "max_fail_ratio = 2.0", "max_fail_ratio"),
        ("[loadtest]", "[loadtest]\nthink_time = 1", "unknown keys"),
    ],
)
def test_bad_loadtest_settings_are_refused(tmp_path, old, new, message):
    text = load_settings().path.read_text()
    assert old in text
    path = tmp_path / "settings.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SettingsError, match=message):
        load_settings(path)


def test_stage_breakdown_and_metrics_deltas():
    from bench import e2e_bench

    assert e2e_bench.stage_breakdown is triton_stats.stage_breakdown  # one copy, shared with the bench
    raw = {
        "model_stats": [
            {
                "name": "encoder",
                "inference_count": "40",
                "execution_count": "10",
                "inference_stats": {
                    "success": {"count": "40", "ns": "80000000"},
                    "queue": {"ns": "40000000"},
                    "compute_infer": {"ns": "20000000"},
                },
            }
        ]
    }
    after = triton_stats.parse_statistics(raw)
    stages = triton_stats.stage_breakdown({}, after)["encoder"]
    assert stages["queue_us"] == 1000.0 and stages["compute_infer_us"] == 500.0 and stages["request_us"] == 2000.0
    assert stages["mean_batch"] == 4.0 and stages["requests"] == 40
    assert triton_stats.format_breakdown({"encoder": stages})[1].split()[:3] == ["encoder", "40", "1.00"]
    text = (
        "# HELP nv_inference_request_success x\n"
        'nv_inference_request_success{model="encoder",version="1"} 50\n'
        'nv_inference_request_failure{model="encoder",reason="BACKEND",version="1"} 2\n'
        'nv_inference_request_failure{model="encoder",reason="OTHER",version="1"} 1\n'
        "nv_cpu_utilization 0.5\n"
    )
    before = {"encoder": {"nv_inference_request_success": 10.0, "nv_inference_request_failure": 1.0}}
    delta = triton_stats.metrics_delta(before, triton_stats.parse_metrics(text))
    assert delta["encoder"] == {"nv_inference_request_success": 40.0, "nv_inference_request_failure": 2.0}
    assert delta["server"] == {"nv_cpu_utilization": 0.5}
