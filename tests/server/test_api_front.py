"""The API front (serving/api/app.py) on the real tritonserver, called by clients nobody here wrote:
the official `openai` package and langchain-openai's OpenAIEmbeddings; TEI's routes and every error case."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import socket

import httpx
import numpy as np
import openai
import pytest

from client import TextClient
from common.hf_tokenizer import load_tokenizer
from protocol.api_key import API_KEY_ENV
from serving.launcher.harness import local_server
from serving.launcher.triton_command import free_ports
from tests.server.api_front_process import SENTENCES, Front, urls
from tests.support import DOCKER, load_module

healthcheck = load_module("healthcheck", DOCKER / "healthcheck.py")


@pytest.fixture(scope="module")
def sdk(front):
    return openai.OpenAI(base_url=front.url + "/v1", api_key="not-needed", max_retries=0)


@pytest.fixture(scope="module")
def ensemble(server):
    with TextClient(server.grpc_url, "grpc") as client:
        return client.embed(SENTENCES)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def token_counts(exported, settings) -> list[int]:
    tokenizer = load_tokenizer(exported / "tokenizer.json", settings.max_tokens(exported))
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(SENTENCES)]


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])  # None: the SDK asks for base64 itself
def test_openai_sdk_gets_the_ensembles_embeddings(sdk, ensemble, reference_model, settings, exported, encoding_format):
    extra = {"encoding_format": encoding_format} if encoding_format else {}
    answer = sdk.embeddings.create(model=settings.model.name, input=SENTENCES, **extra)
    rows = [item.embedding for item in sorted(answer.data, key=lambda item: item.index)]
    if encoding_format == "base64":  # asked for by name, the SDK hands the strings over as they came
        rows = [np.frombuffer(base64.b64decode(row), dtype="<f4") for row in rows]
    vectors = np.array(rows)
    assert vectors.shape == ensemble.shape and answer.model == settings.model.name
    assert cosines(vectors, ensemble).min() >= 0.99999
    reference = reference_model.encode(SENTENCES, normalize_embeddings=True)
    assert cosines(vectors, reference).min() >= 0.9999
    counts = token_counts(exported, settings)
    assert max(counts) == settings.max_tokens(exported) and min(counts) == 2, (
        "the long text truncated, '' is [CLS] [SEP]"
    )
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(counts)


def test_base64_is_little_endian_float32(front, ensemble, settings):
    answer = front.post(
        "/v1/embeddings", {"model": settings.model.name, "input": SENTENCES[:2], "encoding_format": "base64"}
    )
    rows = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in answer.json()["data"]]
    np.testing.assert_allclose(np.stack(rows), ensemble[:2], atol=1e-6)


def test_langchain_openai_embeddings(front, ensemble, settings):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: send the texts themselves, not tiktoken ids (tiktoken would download).
    embeddings = OpenAIEmbeddings(
        model=settings.model.name, base_url=front.url + "/v1", api_key="not-needed", check_embedding_ctx_length=False
    )
    documents = np.array(embeddings.embed_documents(SENTENCES))
    assert cosines(documents, ensemble).min() >= 0.99999
    assert cosines([embeddings.embed_query(SENTENCES[0])], ensemble[:1]).min() >= 0.99999


def test_dimensions_truncate_and_renormalize(sdk, ensemble, settings):
    answer = sdk.embeddings.create(model=settings.model.name, input=SENTENCES, dimensions=64, encoding_format="float")
    vectors = np.array([item.embedding for item in answer.data])
    expected = ensemble[:, :64] / np.linalg.norm(ensemble[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


def test_models_lists_the_one_served(sdk, settings):
    assert [model.id for model in sdk.models.list()] == [settings.model.name]
    assert sdk.models.retrieve(settings.model.name).id == settings.model.name
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sdk.models.retrieve("text-embedding-3-small")


def test_more_texts_than_max_batch_size_come_back_in_order(front, settings, ensemble):
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(settings.ensemble.max_batch_size + 7)]
    answer = front.post("/v1/embeddings", {"model": settings.model.name, "input": texts})
    vectors = np.array([item["embedding"] for item in answer.json()["data"]])
    assert [item["index"] for item in answer.json()["data"]] == list(range(len(texts)))
    assert cosines(vectors, ensemble[[i % len(SENTENCES) for i in range(len(texts))]]).min() >= 0.99999


def test_tei_embed_and_tokenize(front, ensemble, exported, settings):
    embedded = front.post("/embed", {"inputs": SENTENCES})
    assert cosines(embedded.json(), ensemble).min() >= 0.99999
    assert cosines(front.post("/embed", {"inputs": SENTENCES[0]}).json(), ensemble[:1]).min() >= 0.99999
    tokenizer = load_tokenizer(exported / "tokenizer.json", settings.max_tokens(exported))
    (tokens,) = front.post("/tokenize", {"inputs": "Hello world"}).json()
    encoding = tokenizer.encode("Hello world")
    assert [t["id"] for t in tokens] == encoding.ids
    assert [t["special"] for t in tokens] == [True, False, False, True]
    assert [(t["start"], t["stop"]) for t in tokens[1:-1]] == [(0, 5), (6, 11)]
    info = httpx.get(front.url + "/info").json()
    assert info["model_id"] == settings.model.name and info["max_input_length"] == settings.max_tokens(exported)


def test_health_and_metrics(front):
    assert httpx.get(front.url + "/health").status_code == 200
    assert healthcheck.api_problem(front.url, 5.0) is None  # the server image's health check: /health and /v1
    metrics = httpx.get(front.url + "/metrics")
    assert metrics.status_code == 200 and "nv_inference_count" in metrics.text


LONG = "x" * ((1 << 20) + 1)  # one byte over tokenizer.max_text_bytes


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        ({"model": "all-MiniLM-L6-v2", "input": ["fine", 3]}, 400, "input[1]", "must be a string"),
        ({"model": "all-MiniLM-L6-v2", "input": [[101, 102]]}, 400, "input[0]", "token ids are not accepted"),
        ({"model": "all-MiniLM-L6-v2", "input": []}, 400, "input", "non-empty list"),
        ({"model": "all-MiniLM-L6-v2"}, 400, "input", "'input' is required"),
        ({"model": "all-MiniLM-L6-v2", "input": "a", "encoding_format": "int4"}, 400, "encoding_format", "one of"),
        ({"model": "all-MiniLM-L6-v2", "input": "a", "dimensions": 0}, 400, "dimensions", "1..384"),
        ({"model": "all-MiniLM-L6-v2", "input": "a", "dimensions": 385}, 400, "dimensions", "1..384"),
        ({"model": "all-MiniLM-L6-v2", "input": "a", "colour": 1}, 400, "colour", "unknown fields"),
        ({"model": "text-embedding-3-small", "input": "a"}, 404, "model", "does not exist"),
        ({"model": "all-MiniLM-L6-v2", "input": ["ok", LONG]}, 400, "input[1]", "at most 1048576"),
        ({"model": "all-MiniLM-L6-v2", "input": ["a"] * 2049}, 413, "input", "at most 2048"),
        (["not", "an", "object"], 400, None, "JSON object"),
    ],
)
def test_bad_embeddings_requests_get_openai_errors(front, sdk, settings, body, status, param, message):
    answer = front.post("/v1/embeddings", body)
    error = answer.json()["error"]
    assert answer.status_code == status and error["param"] == param and message in error["message"], error
    assert error["type"] == "invalid_request_error"
    assert sdk.embeddings.create(model=settings.model.name, input="still serving").data, "the next request is served"


def test_bad_unicode_and_bad_json_are_named(front):
    answer = httpx.post(
        front.url + "/v1/embeddings",
        content=b'{"input": ["ok", "\\ud800"]}',
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input[1]", answer.text
    answer = httpx.post(
        front.url + "/v1/embeddings", content=b'{"input": ', headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]["message"]


def test_predict_needs_a_classifier_and_tei_flags_are_checked(front):
    refused = front.post("/predict", {"inputs": "a"})
    assert refused.status_code == 400 and "is an embedding model, not a classification model" in refused.text
    assert front.post("/rerank", {"query": "q", "texts": ["a"]}).status_code == 400
    answer = front.post("/embed", {"inputs": "a", "truncate": "no"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "truncate"
    direction = front.post("/embed", {"inputs": "a", "truncation_direction": "middle"})
    assert direction.status_code == 400 and direction.json()["error"]["param"] == "truncation_direction"
    assert front.post("/embed", {"inputs": "a", "truncate": False}).status_code == 200  # within the limit: served


def test_body_over_the_limit_is_refused_before_it_is_read(front):
    """Headers that announce 100 MB and no body: the answer comes at once, so nothing was read first."""
    with socket.create_connection(("127.0.0.1", front.port), 10) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 104857600\r\n\r\n"
        )
        sock.settimeout(10)
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in head, head[:300]


def test_api_key_is_required_when_configured(server, repository, settings, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    keyed = Front(repository, urls(server))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            answer = keyed.post("/v1/embeddings", {"input": "a"}, headers=headers)
            assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.embeddings.create(model=settings.model.name, input="a").data
        assert httpx.get(keyed.url + "/health").status_code == 200, "probes need no key"
    finally:
        keyed.stop()


def test_not_ready_is_503_with_retry_after(repository):
    dead_grpc, dead_http = free_ports(2)
    dead = (
        f"127.0.0.1:{dead_grpc}",
        f"http://127.0.0.1:{dead_http}/ready",
        f"http://127.0.0.1:{dead_http}/metrics",
    )
    front = Front(repository, dead)
    try:
        for answer in (front.post("/v1/embeddings", {"input": "a"}), httpx.get(front.url + "/health")):
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "1", answer.text
        # The server image's health check (--api-url) fails with it, naming the route.
        assert healthcheck.api_problem(front.url, 5.0).startswith("/health: HTTP 503")
    finally:
        front.stop()


def test_too_many_in_flight_is_429(server, repository, settings):
    one = Front(repository, urls(server), "api.max_concurrent_requests=1")
    try:
        statuses = asyncio.run(flood(one.url, settings.model.name, [" ".join(["busy"] * 200)] * 16))
    finally:
        one.stop()
    assert set(statuses) == {200, 429}, statuses


def test_a_full_triton_queue_is_429(settings, exported, tmp_path_factory):
    from model_repository.generate import generate

    tight = dataclasses.replace(
        settings, encoder=dataclasses.replace(settings.encoder, max_queue_size=2, max_queue_delay_us=0)
    )
    root = generate(tight, exported, tmp_path_factory.mktemp("api_overload") / "repo")
    server = local_server(tight, root, tmp_path_factory.mktemp("api_overload_server")).start()
    front = Front(root, urls(server), "api.coalesce_calls=0")  # every request its own call: Triton's queue fills
    try:
        statuses = asyncio.run(flood(front.url, settings.model.name, [" ".join(["overload"] * 200)] * 48))
        assert front.post("/v1/embeddings", {"input": "after the storm"}).status_code == 200
    finally:
        front.stop()
        server.stop()
    assert set(statuses) == {200, 429}, statuses


async def flood(url: str, model: str, texts: list[str]) -> list[int]:
    """Every text as its own request, all at once; the status of each (429s must carry Retry-After)."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=len(texts))) as client:

        async def send(text: str) -> int:
            answer = await client.post(url + "/v1/embeddings", json={"model": model, "input": text})
            assert answer.status_code != 429 or answer.headers["Retry-After"] == "1"
            return answer.status_code

        return await asyncio.gather(*(send(text) for text in texts))


def test_predict_ranks_a_classifiers_labels_as_the_ensemble_scores_them(classification_export, tmp_path_factory):
    from common.contract import ServingSpec
    from model_repository.generate import generate
    from settings import load_settings

    classifier = load_settings(None, ['model.task="classification"'])
    root = generate(classifier, classification_export, tmp_path_factory.mktemp("api_cls") / "repo")
    server = local_server(classifier, root, tmp_path_factory.mktemp("api_cls_server")).start()
    front = Front(root, urls(server), 'model.task="classification"')
    texts = ["great movie", "terrible service, never again"]
    try:
        with TextClient(server.grpc_url, "grpc") as client:
            served = client.infer(texts)
        ranked = front.post("/predict", {"inputs": texts}).json()
        single = front.post("/predict", {"inputs": texts[0]}).json()
        embeddings = front.post("/v1/embeddings", {"input": "a"})
        # A server with no embedding model: the image's health check asks /v1/models instead, and passes.
        unhealthy = healthcheck.api_problem(front.url, 5.0)
    finally:
        front.stop()
        server.stop()
    labels = ServingSpec.load(classification_export).labels
    for row, scores, label in zip(ranked, served["scores"], served["label"].reshape(-1), strict=True):
        assert [item["label"] for item in row] == [labels[i] for i in np.argsort(-scores, kind="stable")]
        np.testing.assert_allclose([item["score"] for item in row], np.sort(scores)[::-1], atol=1e-6)
        assert row[0]["label"] == label
    assert single == ranked[0], "one text in, one ranking out"
    assert embeddings.status_code == 400 and "use POST /predict" in embeddings.json()["error"]["message"]
    assert unhealthy is None, unhealthy
