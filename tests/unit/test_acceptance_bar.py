"""The acceptance bar on its own: verdicts naming every threshold, the knee finder, the settings section, the
statistics helpers."""

from __future__ import annotations

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
