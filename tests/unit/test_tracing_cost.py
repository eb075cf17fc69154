"""bench.tracing_cost's own logic: each phase's settings file (its [tracing] replaced, whatever the file had)
and the summary (the cost against the 3 % bar, whose spans came while tracing was off)."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.tracing_cost import phase_settings, summarize
from settings import DEFAULT_SETTINGS, ROOT, load_settings


@pytest.mark.parametrize("source", [DEFAULT_SETTINGS, ROOT / "settings/variants/bert-base-h200.toml"])
def test_a_phase_gets_its_tracing_and_keeps_the_rest(source, tmp_path):
    path = phase_settings(source, tmp_path, "tracing-on-1", "http://127.0.0.1:4318", 0.01)
    settings, original = load_settings(path), load_settings(source)
    assert (settings.tracing.endpoint, settings.tracing.sample_rate) == ("http://127.0.0.1:4318", 0.01)
    assert (settings.model, settings.encoder, settings.api) == (original.model, original.encoder, original.api)
    off = load_settings(phase_settings(path, tmp_path, "tracing-off-2", "", 0.01))
    assert off.tracing.endpoint == "" and off.tracing.service_name == "tracing-off-2"


def test_the_summary_weighs_on_against_off_and_names_spans_of_no_traced_phase():
    def phase(label, traced, rps):
        return {
            "label": label,
            "tracing": traced,
            "runs": {"grpc": {"rps": rps}},
            "requests_sent": {"grpc": 1000},
            "triton_requests": 1000.0,
        }

    phases = [phase("tracing-off-1", False, 100.0), phase("tracing-on-1", True, 98.0)]
    phases += [phase("tracing-off-2", False, 104.0), phase("tracing-on-2", True, 96.0)]
    spans = Counter({"tracing-on-1-triton": 30, "tracing-on-2-triton": 25, "tracing-off-2-api": 1, "stray": 2})
    traces = Counter({"tracing-on-1-triton": 10, "tracing-on-2-triton": 9, "tracing-off-2-api": 1, "stray": 1})
    summary = summarize(phases, ["grpc"], spans, traces, 0.01)
    grpc = summary["routes"]["grpc"]
    assert grpc["cost"] == round(1 - 97 / 102, 4) and not grpc["within_bar"]
    assert grpc["on_over_off"] == [0.98, 0.923] and grpc["off_spread"] == round(4 / 102, 3)
    assert summary["spans_while_off"] == 3 and summary["unattributed_services"] == ["stray"]
    assert phases[1]["spans"] == {"triton": 30} and phases[1]["sampled"]["triton"] == 0.01
    assert phases[2]["spans"] == {"api": 1}
