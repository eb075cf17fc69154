"""The input catalogue: every odd or malformed request gets a defined outcome and the server keeps serving.

Outcomes: an embedding (documented behaviour: empty and whitespace-only texts embed [CLS] [SEP]; control
characters are dropped by the tokenizer's normalizer; texts past max_tokens are truncated) or a clear
error naming the problem (a text over tokenizer.max_text_bytes among them, refused before it is tokenized).
After every case a good request must still succeed."""

from __future__ import annotations

import functools
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from client import TextClient
from model_repository.stages.stage_metrics import FLUSH_INTERVAL_S
from tests.support import over_limit_texts, samples, scrape


def text_tensor(values, shape=None, name="text", datatype="BYTES"):
    data = np.array(values, dtype=np.object_ if datatype == "BYTES" else np.int32)
    data = data.reshape(shape if shape is not None else (-1, 1))
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


@pytest.fixture
def server(topology_server):
    """Every case against each topology's server: the catalogue's outcomes do not depend on it."""
    return topology_server


@pytest.fixture
def good_after(server):
    yield
    with TextClient(server.grpc_url, "grpc") as client:
        assert np.isfinite(client.embed(["the server still serves"])).all()


@pytest.mark.parametrize(
    ("text", "same_as"),
    [
        pytest.param("", None, id="empty"),  # [CLS] [SEP], as sentence-transformers embeds it
        pytest.param("   \t\n  ", "", id="whitespace-only"),
        pytest.param("abc\x00\x07\x1bdef", "abcdef", id="control-characters"),  # dropped by the normalizer
        pytest.param("😀🎉 東京は日本の首都です مرحبا بالعالم", None, id="emoji-cjk-rtl"),
        pytest.param("word " * 5000, "word " * 300, id="more-tokens-than-max"),  # both past max_tokens
        pytest.param("x" * (1 << 20), "x" * 101, id="one-megabyte"),  # one word past WordPiece's 100: [UNK]
    ],
)
def test_odd_texts_embed_as_documented(server, good_after, reference_model, text, same_as):
    """Each odd text embeds as the README says: as sentence-transformers does, or as the text it amounts to."""
    with TextClient(server.grpc_url, "grpc") as client:
        got, *equivalent = client.embed([text] if same_as is None else [text, same_as])
    assert np.isfinite(got).all()
    if same_as is None:
        reference = reference_model.encode([text], convert_to_numpy=True)[0]
        cosine = got @ reference / (np.linalg.norm(got) * np.linalg.norm(reference))
        assert cosine >= 0.9999, cosine
    else:
        np.testing.assert_allclose(got, equivalent[0], atol=1e-6, rtol=0)


def test_truncation_is_to_the_first_max_tokens(server, good_after, settings, exported):
    # Words that are one token each: the text past max_tokens must not change the embedding.
    head = " ".join(["river"] * (settings.max_tokens(exported) - 2))
    with TextClient(server.grpc_url, "grpc") as client:
        short, long = client.embed([head, head + " mountain" * 300])
    np.testing.assert_allclose(short, long, atol=1e-5)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        pytest.param([text_tensor([b"hi"], name="txt")], "txt", id="wrong-input-name"),
        pytest.param([text_tensor([1, 2], datatype="INT32")], "INT32", id="wrong-dtype"),
        pytest.param([text_tensor([b"a", b"b", b"c", b"d"], shape=(2, 2))], "shape", id="wrong-shape"),
        pytest.param([], "missing required input", id="missing-input"),
        pytest.param([text_tensor([], shape=(0, 1))], "got 0", id="zero-length-batch"),
        pytest.param([text_tensor([b"t"] * 257)], "batch-size must be <= 256", id="batch-over-max-batch-size"),
        pytest.param([text_tensor([b"\xff\xfe"])], "not valid UTF-8", id="invalid-utf8"),
    ],
)
def test_malformed_requests_get_clear_errors(server, good_after, inputs, message):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", inputs)
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message.lower() in str(failure.value).lower()


class TokenizerCounts:
    """The tokenizing stage's own counters on the metrics port (requests it was given, tokens it produced,
    execute() calls that tokenized a text) and Triton's count of its execute() calls."""

    COUNTERS = ("requests_total", "tokens_total", "texts_per_execute_count")

    def __init__(self, server) -> None:
        self.server = server
        self.model = "ensemble" if server.settings.topology == "one_stage" else "tokenizer"
        self.stats = grpcclient.InferenceServerClient(server.grpc_url)
        time.sleep(2 * FLUSH_INTERVAL_S)  # what earlier requests counted has been sent by now
        self.before = self._read()

    def _read(self) -> dict[str, float]:
        text = scrape(self.server.host, self.server.ports.metrics)
        counts = {name: samples(text, f"bert_tokenizer_{name}", model=self.model) for name in self.COUNTERS}
        stats = self.stats.get_inference_statistics(self.model, as_json=True)["model_stats"][0]
        return {**counts, "executions": int(stats.get("execution_count", 0))}

    def since(self, requests: int) -> dict[str, float]:
        """What was counted since, once the flush holding `requests` more requests has come."""
        deadline = time.monotonic() + 10 * FLUSH_INTERVAL_S
        while True:
            delta = {name: value - self.before[name] for name, value in self._read().items()}
            if delta["requests_total"] >= requests or time.monotonic() > deadline:
                return delta
            time.sleep(0.1)


@pytest.mark.parametrize("case", ["one-byte-over", "multi-byte", "four-times"])
def test_text_over_max_text_bytes_is_refused_before_it_is_tokenized(server, good_after, settings, case):
    limit = settings.tokenizer.max_text_bytes
    text = over_limit_texts(limit)[case]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    counts = TokenizerCounts(server)
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", [text_tensor([b"a fine text", text])])
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"text[1] is {len(text)} bytes, over the limit of {limit} (tokenizer.max_text_bytes)" in str(failure.value)
    # The stage was given the request and produced no token: neither text of the request was tokenized.
    counted = counts.since(requests=1)
    assert (counted["requests_total"], counted["tokens_total"]) == (1, 0), counted


def test_request_over_max_request_bytes_is_refused_before_any_text_is_tokenized(server, good_after, settings):
    """Texts each under max_text_bytes, over max_request_bytes together."""
    each = settings.tokenizer.max_text_bytes
    count = settings.tokenizer.max_request_bytes // each + 1
    texts = [b"word " * (each // 5)] * count
    client = grpcclient.InferenceServerClient(server.grpc_url)
    counts = TokenizerCounts(server)
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", [text_tensor(texts)])
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    total = sum(map(len, texts))
    limit = settings.tokenizer.max_request_bytes
    assert f"the request's {count} texts are {total} bytes together, over the limit of {limit}" in str(failure.value)
    counted = counts.since(requests=1)
    assert (counted["requests_total"], counted["tokens_total"]) == (1, 0), counted


def test_text_over_max_text_bytes_fails_only_its_own_request(server, good_after, settings):
    """Refused and good requests sent together through the server: the refused ones fail, the others are
    answered (test_a_refused_request_in_an_execute_fails_alone has them in one execute() for certain)."""
    huge = over_limit_texts(settings.tokenizer.max_text_bytes)["one-byte-over"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    texts = [huge if i % 4 == 1 else f"text number {i}".encode() for i in range(32)]
    counts = TokenizerCounts(server)
    # A long request first keeps the stage busy, so that the others, sent at once behind it, queue and are
    # batched: async_infer returns as soon as a request is sent.
    requests = [text_tensor([b" ".join([b"busy"] * 200)] * 256)] + [text_tensor([text]) for text in texts]
    answers: queue.Queue = queue.Queue()
    for index, tensor in enumerate(requests):
        callback = functools.partial(lambda i, result, error: answers.put((i, result, error)), index)
        client.async_infer("ensemble", [tensor], callback)
    outcomes = {}
    for _ in requests:
        index, result, error = answers.get(timeout=120)
        outcomes[index] = error if error is not None else result.as_numpy("embedding")
    busy, *results = (outcomes[index] for index in range(len(requests)))
    assert isinstance(busy, np.ndarray) and busy.shape == (256, 384)
    for text, result in zip(texts, results, strict=True):
        if text is huge:
            assert isinstance(result, InferenceServerException) and "tokenizer.max_text_bytes" in str(result)
        else:
            assert isinstance(result, np.ndarray) and result.shape == (1, 384) and np.isfinite(result).all()
    counted = counts.since(requests=len(texts) + 1)
    assert counted["requests_total"] == len(texts) + 1
    assert counted["executions"] < len(requests), "batched: requests shared execute() calls"


FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_server_answers_any_bytes_with_an_embedding_or_a_clear_error(server, payload):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("text", [len(payload), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(payload, dtype=np.object_).reshape(-1, 1))
    try:
        result = client.infer("ensemble", [tensor]).as_numpy("embedding")
    except InferenceServerException as exc:
        assert exc.status() == "StatusCode.INVALID_ARGUMENT" and "not valid UTF-8" in str(exc)
        assert any(not _is_utf8(item) for item in payload)
    else:
        assert result.shape == (len(payload), 384) and np.isfinite(result).all()
        assert all(_is_utf8(item) for item in payload)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
