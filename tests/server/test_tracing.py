"""Tracing on the real launcher (serving/tracing.py): a request sent with a W3C traceparent is one trace, the
front's span and tritonserver's spans under the sender's trace id, through the API front and through the HTTP
front; a malformed traceparent is ignored (a new trace starts) and never fails the request. Spans go to a real
OTLP/HTTP receiver built on opentelemetry-proto (bench/otlp_receiver.py)."""

from __future__ import annotations

import re

import httpx
import pytest

from bench.otlp_receiver import OtlpReceiver
from common.contract import TEXT_INPUT
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports


@pytest.fixture(scope="module")
def receiver():
    started = OtlpReceiver()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def traced(settings, repository, receiver, tmp_path_factory):
    folder = tmp_path_factory.mktemp("traced")
    text = settings.path.read_text()
    text, count = re.subn(r'^endpoint = ""', f'endpoint = "{receiver.url}"', text, flags=re.M)
    text, rates = re.subn(r"^sample_rate = [0-9.]+", "sample_rate = 1.0", text, flags=re.M)
    text, spans = re.subn(r"^triton_spans = false", "triton_spans = true", text, flags=re.M)  # Triton's spans too
    assert count == rates == spans == 1
    (folder / "settings.toml").write_text(text)
    started = Launcher(folder / "settings.toml", repository, Ports.free(), folder / "launcher.log").start()
    yield started
    started.kill()


def traceparent(trace_id: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{'ab' * 8}-01"}


def services_in(trace_id: str):
    return lambda spans: {span.service for span in spans if span.trace_id == trace_id}


def test_an_api_request_is_one_trace_from_the_front_into_tritonserver(traced, receiver, settings):
    # Triton 2.51 reads a gRPC traceparent as a C string (GrpcServerCarrier::Get returns string_ref::data(), which
    # is not NUL-terminated), so the bytes after it in memory decide whether it parses: 34 of 720 calls in six runs
    # (2026-12-06) started a trace of their own (docs/deployment.md). The front passes every call its context; of
    # four requests, at least one must come back as one trace.
    trace_ids = [f"0af7651916cd43dd8448eb211c8031{index:02x}" for index in range(4)]
    for trace_id in trace_ids:
        answer = httpx.post(
            f"http://127.0.0.1:{traced.ports.api}/v1/embeddings",
            json={"model": settings.model.name, "input": "follow me"},
            headers=traceparent(trace_id),
            timeout=60,
        )
        assert answer.status_code == 200
    both = {"bert-triton-api", "bert-triton-triton"}
    spans = receiver.wait_for(
        lambda spans: (
            all("bert-triton-api" in services_in(t)(spans) for t in trace_ids)
            and any(both <= services_in(t)(spans) for t in trace_ids)
        )
    )
    joined = [t for t in trace_ids if both <= services_in(t)(spans)]
    assert joined, spans[-10:]
    for trace_id in trace_ids:
        mine = [span for span in spans if span.trace_id == trace_id]
        (front,) = [span for span in mine if span.service == "bert-triton-api"]
        assert front.parent_id == "ab" * 8 and front.name == "POST /v1/embeddings"
        triton = [span for span in mine if span.service == "bert-triton-triton"]
        assert not triton or any(span.parent_id == front.span_id for span in triton), mine


def test_a_kserve_request_through_the_http_front_is_one_trace(traced, receiver):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    body = {"inputs": [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [1, 1], "data": ["over HTTP"]}]}
    answer = httpx.post(
        f"http://127.0.0.1:{traced.ports.http}/v2/models/ensemble/infer", json=body, headers=traceparent(trace_id)
    )
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(lambda spans: {"bert-triton-front", "bert-triton-triton"} <= services_in(trace_id)(spans))
    assert services_in(trace_id)(spans) >= {"bert-triton-front", "bert-triton-triton"}, spans[-10:]


@pytest.mark.parametrize("bad", ["garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-zz-yy-01" + "x" * 5000])
def test_a_malformed_traceparent_starts_a_new_trace_and_the_request_is_served(traced, receiver, settings, bad):
    answer = httpx.post(
        f"http://127.0.0.1:{traced.ports.api}/v1/embeddings",
        json={"model": settings.model.name, "input": "who sent this?"},
        headers={"traceparent": bad, "X-Request-Id": "bad-parent"},
        timeout=60,
    )
    assert answer.status_code == 200
