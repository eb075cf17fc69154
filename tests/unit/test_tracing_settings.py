"""[tracing] (serving/tracing.py) off by default: no spans, no Triton trace flags, no front arguments; on, the
flags Triton needs, its rate the inverse of the sample rate; and settings that cannot work are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.http_front.proxy import command as http_front_command
from serving.launcher.triton_command import Ports, server_command, trace_flags
from serving.tracing import Tracing
from settings import SettingsError, load_settings


def triton_flags(settings) -> list[str]:
    ports = Ports.of(settings)
    return server_command(Path("tritonserver"), Path("r"), Path("b"), ports, "127.0.0.1", 10, tracing=settings.tracing)


def test_tracing_is_off_by_default_and_then_costs_nothing():
    settings = load_settings()
    assert settings.tracing.endpoint == "" and Tracing.of(settings.tracing, "api") is None
    assert not [flag for flag in triton_flags(settings) if flag.startswith("--trace-config")]
    assert not [arg for arg in http_front_command("h", 1, 2, 3, "text", settings.tracing) if arg.startswith("--trace")]


def test_tracing_on_starts_tritonserver_with_opentelemetry_towards_the_same_collector():
    on = ['tracing.endpoint="http://collector:4318/"', "tracing.sample_rate=0.25"]
    fronts_only = load_settings(None, on)
    assert not any(flag.startswith("--trace-config") for flag in triton_flags(fronts_only)), "upstream issue 7795"
    settings = load_settings(None, [*on, "tracing.triton_spans=true"])
    assert trace_flags(settings.tracing) == [
        "--trace-config=mode=opentelemetry",
        "--trace-config=opentelemetry,url=http://collector:4318/v1/traces",
        "--trace-config=opentelemetry,resource=service.name=bert-triton-triton",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=4",
    ]
    assert set(trace_flags(settings.tracing)) <= set(triton_flags(settings))
    arguments = http_front_command("h", 1, 2, 3, "json", settings.tracing)
    assert arguments[arguments.index("--trace-endpoint") + 1] == "http://collector:4318/"


@pytest.mark.parametrize(
    "override", ['tracing.endpoint="collector:4318"', "tracing.sample_rate=0", "tracing.sample_rate=1.5"]
)
def test_tracing_settings_that_cannot_work_are_refused(override):
    with pytest.raises(SettingsError, match="tracing"):
        load_settings(None, ['tracing.endpoint="http://c:4318"', override])


def test_requests_without_a_caller_s_context_are_sampled_at_the_rate_and_a_caller_s_flag_is_followed():
    import random

    settings = load_settings(None, ['tracing.endpoint="http://127.0.0.1:9"', "tracing.sample_rate=0.25"])
    tracing = Tracing(settings.tracing, "api")
    tracing._draw = random.Random(7).random  # a fixed sequence of draws for this test
    traced = 0
    for index in range(2000):
        with tracing.request_span("POST /v1/embeddings", {}, str(index)) as carrier:
            traced += bool(carrier)
    assert 400 < traced < 600, traced  # 2000 x 0.25
    sampled, unsampled = (f"00-{'ab' * 16}-{'cd' * 8}-{flag}" for flag in ("01", "00"))
    with tracing.request_span("POST /v1/embeddings", {"traceparent": sampled}, "x") as carrier:
        assert carrier["traceparent"].startswith(f"00-{'ab' * 16}-")
    with tracing.request_span("POST /v1/embeddings", {"traceparent": unsampled}, "y") as carrier:
        assert carrier == {}
