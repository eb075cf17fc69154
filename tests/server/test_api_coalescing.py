"""Coalescing in the API front (serving/api/coalescer.py) on the real tritonserver: requests that share one Triton
call get the answers they get alone (order, usage, the embedding bytes), a text Triton refuses fails its own
request only, a client that leaves mid-batch costs the others nothing, and /metrics counts the shared calls in
files that go with the front."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import tempfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server.api_front_process import SENTENCES, Front, urls

# One call in flight and a wide window: requests sent together are sure to share calls.
COALESCING = ("api.coalesce_calls=1", "api.coalesce_window_ms=20")
SENTENCES = [*SENTENCES, "A cheetah is running behind its prey.", "The weather is lovely today."]


@pytest.fixture(scope="module")
def coalescing(server, repository):
    started = Front(repository, urls(server), *COALESCING)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def alone(server, repository):
    started = Front(repository, urls(server), "api.coalesce_calls=0")
    yield started
    started.stop()


def bodies(model: str) -> list[tuple[str, dict]]:
    """(route, body) of OpenAI (float and base64, one text and several) and TEI requests over SENTENCES."""
    requests = []
    for index, sentence in enumerate(SENTENCES):
        encoding = ("float", "base64")[index % 2]
        requests.append(("/v1/embeddings", {"model": model, "input": sentence, "encoding_format": encoding}))
        requests.append(("/v1/embeddings", {"model": model, "input": SENTENCES[index:], "encoding_format": encoding}))
        requests.append(("/embed", {"inputs": SENTENCES[: index + 1]}))
    return requests


async def send_all(url: str, requests: list[tuple[str, dict]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=len(requests))) as client:
        return await asyncio.gather(*(client.post(url + path, json=body) for path, body in requests))


def call_counts(front: Front) -> tuple[float, float]:
    """(Triton calls, API requests in them) of the front's bert_api_call_requests histogram, over every Triton
    model it calls (a query's go to the model's query lane)."""
    text = httpx.get(front.url + "/metrics", timeout=30).text
    count = sum(map(float, re.findall(r"^bert_api_call_requests_count\{[^}]*\} (\S+)$", text, re.M)))
    total = sum(map(float, re.findall(r"^bert_api_call_requests_sum\{[^}]*\} (\S+)$", text, re.M)))
    return count, total


def vectors(answer: dict) -> np.ndarray:
    if isinstance(answer, list):  # TEI
        return np.array(answer, dtype=np.float32)
    rows = [item["embedding"] for item in sorted(answer["data"], key=lambda item: item["index"])]
    if rows and isinstance(rows[0], str):
        return np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in rows])
    return np.array(rows, dtype=np.float32)


def test_requests_sharing_calls_get_the_answers_they_get_alone(coalescing, alone, settings):
    requests = bodies(settings.model.name)
    calls_before, shared_before = call_counts(coalescing)
    together = asyncio.run(send_all(coalescing.url, requests))
    calls_after, shared_after = call_counts(coalescing)
    calls, shared = calls_after - calls_before, shared_after - shared_before
    singly = [alone.post(path, body) for path, body in requests]
    assert [answer.status_code for answer in together] == [200] * len(requests)
    assert shared == len(requests) and calls < len(requests) / 2, f"{len(requests)} requests in {calls} calls"
    for (path, _), mine, reference in zip(requests, together, singly, strict=True):
        mine, reference = mine.json(), reference.json()
        if path == "/v1/embeddings":
            assert [item["index"] for item in mine["data"]] == list(range(len(reference["data"])))
            assert mine["usage"] == reference["usage"] and mine["model"] == reference["model"]
        # Triton batches both fronts' texts with others too, so rows may see other padding: within fp32 rounding.
        np.testing.assert_allclose(vectors(mine), vectors(reference), atol=1e-6)


def test_a_text_triton_refuses_fails_only_its_own_request(server, repository, settings):
    """A front whose own limit is above Triton's lets an over-long text into a coalesced call: Triton refuses the
    call, and each request in it is sent again alone."""
    limit = settings.tokenizer.max_text_bytes
    front = Front(repository, urls(server), *COALESCING, f"tokenizer.max_text_bytes={2 * limit}")
    model = settings.model.name
    requests = [("/v1/embeddings", {"model": model, "input": [sentence]}) for sentence in SENTENCES]
    requests.insert(4, ("/v1/embeddings", {"model": model, "input": ["x" * (limit + 1)]}))
    try:
        answers = asyncio.run(send_all(front.url, [("/v1/embeddings", {"model": model, "input": "busy"}), *requests]))
        after = front.post("/v1/embeddings", {"model": model, "input": "still serving"})
    finally:
        front.stop()
    statuses = [answer.status_code for answer in answers[1:]]
    assert statuses == [200] * 4 + [400] + [200] * 4, statuses
    assert "tritonserver refused the texts" in answers[5].json()["error"]["message"]
    assert after.status_code == 200


def test_a_stopped_front_leaves_no_counters_behind(server, repository, settings):
    front = Front(repository, urls(server))
    counters = Path(tempfile.gettempdir()) / f"bert-triton-api-{front.port}-{os.getpid()}"  # this test runs it
    try:
        assert front.post("/v1/embeddings", {"model": settings.model.name, "input": "counted"}).status_code == 200
        assert list(counters.glob("*.u64"))
    finally:
        front.stop()
    assert not counters.exists()


def test_a_client_that_leaves_mid_batch_costs_the_others_nothing(coalescing, settings):
    model, long_text = settings.model.name, " ".join(["patience"] * 200)

    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=32)) as client:
            sends = [
                asyncio.ensure_future(
                    client.post(coalescing.url + "/v1/embeddings", json={"model": model, "input": text})
                )
                for text in [long_text] * 16 + SENTENCES
            ]
            await asyncio.sleep(0.05)
            for leaving in sends[1:16:2]:  # half of the long ones, queued or already in a call
                leaving.cancel()
            return await asyncio.gather(*sends, return_exceptions=True)

    answers = asyncio.run(scenario())
    kept = [answer for index, answer in enumerate(answers) if not (1 <= index < 16 and index % 2)]
    assert all(isinstance(answer, httpx.Response) and answer.status_code == 200 for answer in kept), kept
    reference = coalescing.post("/v1/embeddings", {"model": model, "input": SENTENCES}).json()
    np.testing.assert_allclose(
        np.stack([vectors(answer.json())[0] for answer in kept[-len(SENTENCES) :]]), vectors(reference), atol=2e-6
    )
