"""bench/perf_check.py's verdict: a ratio more than the margin below its baseline fails, naming both figures."""

from __future__ import annotations

import json

import pytest

from bench.perf_check import BASELINES, OTHER_MACHINE_MARGIN, compare, interleaved, margin_for

BASE = {"ratios": {"1x32": 1.3, "8x8": 1.4}}


def test_within_the_margin_passes_and_below_it_fails_naming_both():
    assert compare({"ratios": {"1x32": 1.05, "8x8": 1.5}}, BASE, 0.2) == []
    (failure,) = compare({"ratios": {"1x32": 1.03, "8x8": 1.5}}, BASE, 0.2)
    assert failure.startswith("1x32: 1.03x") and "baseline 1.3x" in failure


def test_a_shape_missing_from_the_run_fails():
    assert compare({"ratios": {"8x8": 1.4}}, BASE, 0.2) == [
        "1x32: Nonex sentence-transformers, baseline 1.3x (more than 20% lower)"
    ]


def test_another_cpu_is_held_to_the_wider_margin():
    here = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}
    assert margin_for(here, dict(here), 0.2) == 0.2
    assert margin_for({"cpu": "AMD EPYC 9R14", "cores": 2}, here, 0.2) == OTHER_MACHINE_MARGIN
    assert margin_for({**here, "cores": 16}, here, 0.2) == OTHER_MACHINE_MARGIN


def test_the_engine_that_auto_picks_is_part_of_the_machines_kind():
    """Zen 3 and Zen 4 both call themselves "AMD EPYC"; "auto" serves ONNX Runtime on one and torch bf16 on the
    other, whose ratios to sentence-transformers differ by more than the margin."""
    zen4 = json.loads((BASELINES / "cpu-torch-bf16.json").read_text())
    zen3 = json.loads((BASELINES / "cpu-onnxruntime_cpu-fp32.json").read_text())
    assert zen4["machine"]["cpu"] == zen3["machine"]["cpu"] == "AMD EPYC"
    assert margin_for(zen3["machine"], zen4["machine"], 0.2) == OTHER_MACHINE_MARGIN
    assert compare(zen3, zen4, 0.2), "held to the other engine's baseline, the Zen 3 ratios fail at 20 %"


@pytest.mark.parametrize(
    ("baseline", "caught"),
    [
        ("cpu-onnxruntime_cpu-fp32.json", "caught-engine-threads-1.json"),
        ("cpu-onnxruntime_cpu-fp32.json", "caught-engine-threads-1-zen3.json"),
        ("cpu-torch-bf16.json", "caught-engine-threads-1.json"),
    ],
)
def test_the_recorded_baselines_and_the_caught_regressions(baseline, caught):
    recorded = json.loads((BASELINES / baseline).read_text())
    assert set(recorded["ratios"]) == {"1x32", "8x8"} and len(recorded["runs"]) == 3
    assert not compare(recorded, recorded, 0.2)
    slowed = json.loads((BASELINES / caught).read_text())
    assert "engine.threads=1" in slowed["command"]
    assert len(compare(slowed, recorded, 0.2)) == 2, "the deliberate slowdown fails the check"


def test_a_gpu_is_held_to_its_own_baseline():
    h200 = json.loads((BASELINES / "gpu-nvidia-h200.json").read_text())
    assert h200["machine"]["gpu"] == "NVIDIA H200" and set(h200["ratios"]) == {"1x64", "1x256"}
    assert margin_for(h200["machine"], h200["machine"], 0.2) == 0.2
    assert margin_for({"gpu": "NVIDIA A100-SXM4-80GB", "cores": 16}, h200["machine"], 0.2) == OTHER_MACHINE_MARGIN
    assert not compare(h200, h200, 0.2)
    caught = json.loads((BASELINES / "caught-gpu-instances-1.json").read_text())
    assert "encoder.instances=1" in caught["command"]
    failures = compare(caught, h200, 0.2, "the engine alone")
    assert len(failures) == 2 and "x the engine alone, baseline" in failures[0], "one instance instead of 8 is caught"


def test_each_round_is_held_to_the_references_timed_around_it():
    references = iter([200.0, 200.0])  # after round 1 and after round 2 (the first is passed in)
    served = iter([150.0, 400.0])
    result = interleaved({"1x1": (1, 1)}, lambda *_: next(served), lambda: next(references), 2, 100.0)
    assert result["round_ratios"] == {"1x1": [1.0, 2.0]}  # 150 / mean(100, 200), 400 / mean(200, 200)
    assert result["ratios"] == {"1x1": 1.5} and result["references"] == [100.0, 200.0, 200.0]
