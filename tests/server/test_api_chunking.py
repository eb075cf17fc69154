"""Long documents as windows on the real tritonserver (serving/api/chunking.py), called by the OpenAI SDK (its
extra_body) and raw HTTP: each window's embedding is sentence-transformers' embedding of its span's text, usage
counts every window's tokens, and every bad field is a 400 (too many windows a 413) naming it while the server
keeps serving."""

from __future__ import annotations

import itertools

import numpy as np
import openai
import pytest

from tests.server.api_front_process import SENTENCES

CHUNKING = {"chunking": {"overlap_tokens": 32}}


@pytest.fixture(scope="module")
def document(sentences) -> str:
    """Over three windows of the model's: the validation sentences, CJK and emoji among them."""
    return " ".join([*sentences[:40], SENTENCES[4], "Emoji too: 🙂🎉👩‍👩‍👧.", *sentences[40:80]])


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_openai_sdk_gets_each_window_as_sentence_transformers_embeds_its_span(
    front, settings, exported, reference_model, document
):
    sdk = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)
    texts = [document, SENTENCES[0]]
    answer = sdk.embeddings.create(model=settings.model.name, input=texts, encoding_format="float", extra_body=CHUNKING)
    assert [item.index for item in answer.data] == list(range(len(answer.data)))
    windows = [(item.text_index, *item.span) for item in answer.data]
    assert windows[-1] == (1, 0, len(SENTENCES[0])), "a short text is one window spanning it all"
    spans = [(start, end) for index, start, end in windows if index == 0]
    assert len(spans) >= 3 and spans[0][0] == 0 and spans[-1][1] == len(document)
    assert all(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), "windows overlap"
    pieces = [texts[index][start:end] for index, start, end in windows]
    reference = reference_model.encode(pieces, normalize_embeddings=True)
    assert cosines([item.embedding for item in answer.data], reference).min() >= 0.9999
    tokenizer = reference_model.tokenizer
    counts = [len(ids) for ids in tokenizer(pieces)["input_ids"]]
    assert max(counts) <= settings.max_tokens(exported) and answer.usage.prompt_tokens == sum(counts)


def test_tei_embed_answers_each_texts_windows_with_their_spans(front, settings, document):
    texts = [SENTENCES[2], document]
    windowed = front.post("/embed", {"inputs": texts, **CHUNKING}).json()
    assert len(windowed[0]) == 1 and len(windowed[1]) >= 3
    assert windowed[0][0]["span"] == [0, len(SENTENCES[2])]
    body = {"model": settings.model.name, "input": texts, **CHUNKING}
    data = front.post("/v1/embeddings", body).json()["data"]
    assert [window["span"] for windows in windowed for window in windows] == [item["span"] for item in data]
    vectors = [window["embedding"] for windows in windowed for window in windows]
    np.testing.assert_allclose(vectors, [item["embedding"] for item in data], atol=1e-6)
    plain = front.post("/embed", {"inputs": texts}).json()
    assert len(plain) == 2 and isinstance(plain[0][0], float), "without chunking nothing changes"
    np.testing.assert_allclose(plain[0], windowed[0][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "message"),
    [
        ("/v1/embeddings", {"input": "a", "chunking": {"overlap_tokens": 254}}, 400, "chunking.overlap_tokens",
         "window holds 254"),
        ("/v1/embeddings", {"input": "a", "chunking": {"overlap_tokens": "32"}}, 400, "chunking.overlap_tokens",
         "must be an integer"),
        ("/v1/embeddings", {"input": "a", "chunking": 32}, 400, "chunking", "must be an object"),
        ("/v1/embeddings", {"input": "a", "chunking": {"stride": 3}}, 400, "chunking.stride", "unknown fields"),
        ("/embed", {"inputs": "a", "chunking": {}, "truncate": False}, 400, "truncate", "does not combine"),
        ("/embed", {"inputs": "a", "chunking": {}, "prompt_name": "query"}, 400, "prompt_name", "does not combine"),
        ("/v1/embeddings", {"input": "hello " * 2400, "chunking": {"overlap_tokens": 253}}, 413, "input",
         "makes 2147 windows; at most 2048"),
        ("/v2/embed", {"texts": ["a"], "chunking": {}}, 400, "chunking", "unknown fields"),
        ("/rerank", {"query": "q", "texts": ["a"], "chunking": {}}, 400, "model", "not a reranker"),
    ],
)  # fmt: skip
def test_bad_chunking_is_named_and_the_server_keeps_serving(front, path, body, status, param, message):
    answer = front.post(path, body)
    error = answer.json()["error"]
    assert answer.status_code == status and error["param"] == param and message in error["message"], error
    assert front.post("/embed", {"inputs": ["still serving"], **CHUNKING}).status_code == 200
