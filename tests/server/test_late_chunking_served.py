"""Late chunking served: a tiny ModernBERT embedder (local and global attention) on the torch engine, model.max_tokens
64 so that a long text is several windows. `"chunking": {"late_chunk_tokens": M}` on /v1/embeddings (the OpenAI SDK's
extra_body) and TEI's /embed answers every chunk of every window with its character span, its vector transformers'
states of the whole window pooled over the chunk's tokens; a bad value is a 400 naming it."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.checkpoints import make_checkpoint
from tests.model.test_late_chunking import reference_chunks
from tests.server.served_checkpoints import Model, served
from tests.support import api_post, api_url

MAX_TOKENS = 64
SIZE = 16
DOCUMENT = " ".join(["Triton batches requests, from many clients, into one call to the model."] * 10)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("late_checkpoint") / "modernbert", "modernbert", "embedding")


@pytest.fixture(scope="module")
def launcher(checkpoint, settings, tmp_path_factory):
    model = Model(checkpoint, "late", "embedding", MAX_TOKENS, engine="torch")
    with served([model], settings, tmp_path_factory.mktemp("late_served")) as started:
        yield started


def test_openai_sdk_gets_every_chunk_of_every_window_as_one_pass_pools_it(launcher, checkpoint):
    """Windows of overlap 8, each read once, chunks of 16 tokens: each item's span lies in its window, the spans of a
    window tile its text, and each vector is the reference's pooling of the window's states."""
    sdk = openai.OpenAI(base_url=api_url(launcher) + "/v1", api_key="unused", max_retries=0)
    chunking = {"chunking": {"overlap_tokens": 8, "late_chunk_tokens": SIZE}}
    short = "A short text, one window."
    answer = sdk.embeddings.create(model="late", input=[DOCUMENT, short], encoding_format="float", extra_body=chunking)
    items = [(item.text_index, *item.span) for item in answer.data]
    assert items[-1] == (1, 0, len(short)), "a short text: one window, one chunk of its own tokens"
    windowed = sdk.embeddings.create(model="late", input=[DOCUMENT], extra_body={"chunking": {"overlap_tokens": 8}})
    windows = [tuple(item.span) for item in windowed.data]
    assert len(windows) >= 3
    vectors, expected, at = np.array([item.embedding for item in answer.data]), [], 0
    for start, end in windows:
        chunks = reference_chunks(checkpoint, DOCUMENT[start:end], SIZE)
        spans = [tuple(item.span) for item in answer.data[at : at + len(chunks)]]
        assert spans[0][0] == start and spans[-1][1] == end and all(start <= a < b <= end for a, b in spans)
        expected.append(chunks)
        at += len(chunks)
    expected.append(reference_chunks(checkpoint, short, SIZE))
    assert at == len(vectors) - 1
    assert ((vectors * np.concatenate(expected)).sum(1)).min() >= 0.9999


def test_tei_embed_answers_each_texts_chunks(launcher):
    body = {"inputs": [DOCUMENT[:200], "tiny"], "chunking": {"late_chunk_tokens": SIZE}}
    status, answer = api_post(launcher, "/embed", body)
    assert status == 200, answer
    assert len(answer[0]) >= 2 and len(answer[1]) == 1 and answer[1][0]["span"] == [0, 4]
    same = {"model": "late", "input": body["inputs"], "chunking": body["chunking"]}
    openai_items = api_post(launcher, "/v1/embeddings", same)[1]["data"]
    np.testing.assert_allclose([c["embedding"] for text in answer for c in text],
                               [item["embedding"] for item in openai_items], atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("chunking", "param", "message"),
    [
        ({"late_chunk_tokens": 0}, "chunking.late_chunk_tokens", "in 1..62"),
        ({"late_chunk_tokens": 63}, "chunking.late_chunk_tokens", "window holds 62"),
        ({"late_chunk_tokens": "16"}, "chunking.late_chunk_tokens", "must be an integer"),
    ],
)
def test_a_bad_late_chunk_size_is_a_400_naming_it(launcher, chunking, param, message):
    status, answer = api_post(launcher, "/v1/embeddings", {"model": "late", "input": "x", "chunking": chunking})
    assert status == 400 and answer["error"]["param"] == param and message in answer["error"]["message"], answer
    assert api_post(launcher, "/embed", {"inputs": "still served", "chunking": {"late_chunk_tokens": 4}})[0] == 200
