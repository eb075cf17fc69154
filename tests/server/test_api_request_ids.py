"""The API front's per-request answers beside the body (serving/api/request_context.py, cors.py), on the real
server: X-Request-Id echoed (or made, when missing or not plain), TEI's timing headers with the tokens the
model read, the id in the log line of a server error, and CORS for the listed origins only."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from serving.api.app import command
from serving.launcher.triton_command import free_ports
from settings import DEFAULT_SETTINGS
from tests.server.api_front_process import Front, urls

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def front(server, repository):
    started = Front(repository, urls(server), f'api.cors_allow_origins=["{ORIGIN}"]')
    yield started
    started.stop()


@pytest.mark.parametrize(("sent", "echoed"), [("req-42.a:b", "req-42.a:b"), (None, None), ("y" * 200, None)])
def test_the_request_id_is_echoed_when_plain_and_made_otherwise(front, settings, sent, echoed):
    answer = front.post(
        "/v1/embeddings",
        {"model": settings.model.name, "input": "hello"},
        headers={"X-Request-Id": sent} if sent else {},
    )
    given = answer.headers["X-Request-Id"]
    assert answer.status_code == 200 and (given == echoed if echoed else re.fullmatch(r"[0-9a-f]{32}", given)), given


def test_tei_timing_headers_count_the_tokens_and_the_time(front, settings):
    answer = front.post("/v1/embeddings", {"model": settings.model.name, "input": ["a few words", "and more words"]})
    timing = {name: int(answer.headers[name]) for name in ("x-total-time", "x-queue-time", "x-inference-time")}
    assert answer.headers["x-compute-tokens"] == str(answer.json()["usage"]["total_tokens"])
    assert (
        0 <= timing["x-queue-time"] <= timing["x-total-time"] and timing["x-inference-time"] <= timing["x-total-time"]
    )
    refused = front.post("/v1/embeddings", {"model": settings.model.name, "input": 3})
    assert (
        refused.status_code == 400 and refused.headers["x-compute-tokens"] == "0" and "X-Request-Id" in refused.headers
    )


def test_a_server_error_is_logged_with_the_request_id(repository, tmp_path):
    """A front whose Triton is gone answers 503; its log line names the request by its id."""
    port, dead_grpc, dead_http = free_ports(3)
    arguments = command(
        [DEFAULT_SETTINGS], repository, "127.0.0.1", port, f"127.0.0.1:{dead_grpc}",
        f"http://127.0.0.1:{dead_http}/ready", f"http://127.0.0.1:{dead_http}/metrics",
    )  # fmt: skip
    log = tmp_path / "front.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, *arguments], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(
                    f"http://127.0.0.1:{port}/v1/embeddings", json={"input": "a"}, headers={"X-Request-Id": "lost-1"}
                )
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None, log.read_text()
                time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert answer.status_code == 503 and answer.headers["X-Request-Id"] == "lost-1"
    assert "api: request lost-1 POST '/v1/embeddings': 503" in log.read_text()


def test_cors_answers_listed_origins_only(front, settings):
    preflight = httpx.options(
        front.url + "/v1/embeddings",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 204 and preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    body = {"model": settings.model.name, "input": "from a browser"}
    allowed = front.post("/v1/embeddings", body, headers={"Origin": ORIGIN})
    assert allowed.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "x-total-time" in allowed.headers["Access-Control-Expose-Headers"]
    other = front.post("/v1/embeddings", body, headers={"Origin": "https://elsewhere.example"})
    assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers
    refused = httpx.options(
        front.url + "/v1/embeddings",
        headers={"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"},
    )
    assert refused.status_code != 204 and "Access-Control-Allow-Origin" not in refused.headers
