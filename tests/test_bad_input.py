"""The input catalogue: every odd or malformed request gets a defined outcome and the server keeps serving.

Outcomes: an embedding (documented behaviour: empty and whitespace-only texts embed [CLS] [SEP]; control
characters are dropped by the tokenizer's normalizer; texts past max_tokens are truncated) or a clear
error naming the problem (a text over tokenizer.max_text_bytes among them, refused before it is tokenized).
After every case a good request must still succeed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client import TextClient


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


def test_truncation_is_to_the_first_max_tokens(server, good_after, settings):
    # Words that are one token each: the text past max_tokens must not change the embedding.
    head = " ".join(["river"] * (settings.model.max_tokens - 2))
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


def over_limit_texts(limit: int) -> dict[str, bytes]:
    return {
        "one-byte-over": b"x" * (limit + 1),
        # Fewer characters than the limit, more bytes: the limit is on bytes.
        "multi-byte": ("東" * (limit // 3 + 1)).encode(),
        # 4 MB without spaces: seconds of tokenizing (no prefix to cut), were it not refused unread.
        "four-times": ("東京" * (4 * limit // 6)).encode(),
    }


@pytest.mark.parametrize("case", ["one-byte-over", "multi-byte", "four-times"])
def test_text_over_max_text_bytes_is_refused_at_once(server, good_after, settings, case):
    limit = settings.tokenizer.max_text_bytes
    text = over_limit_texts(limit)[case]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    start = time.perf_counter()
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", [text_tensor([b"a fine text", text])])
    elapsed = time.perf_counter() - start
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"text[1] is {len(text)} bytes, over the limit of {limit} (tokenizer.max_text_bytes)" in str(failure.value)
    assert elapsed < 1.5, f"refusing took {elapsed:.2f} s"


def test_request_over_max_request_bytes_is_refused_at_once(server, good_after, settings):
    """Texts each under max_text_bytes, over max_request_bytes together: refused before any is tokenized."""
    each = settings.tokenizer.max_text_bytes
    count = settings.tokenizer.max_request_bytes // each + 1
    texts = [b"word " * (each // 5)] * count
    client = grpcclient.InferenceServerClient(server.grpc_url)
    start = time.perf_counter()
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", [text_tensor(texts)])
    elapsed = time.perf_counter() - start
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    total = sum(map(len, texts))
    limit = settings.tokenizer.max_request_bytes
    assert f"the request's {count} texts are {total} bytes together, over the limit of {limit}" in str(failure.value)
    assert elapsed < 3, f"refusing took {elapsed:.2f} s"


def test_text_over_max_text_bytes_fails_only_its_own_request(server, good_after, settings):
    # Sent together, so that they tend to share the tokenizer's execute() calls: the others are answered.
    huge = over_limit_texts(settings.tokenizer.max_text_bytes)["one-byte-over"]
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer(text: bytes):
        try:
            return client.infer("ensemble", [text_tensor([text])]).as_numpy("embedding")
        except InferenceServerException as exc:
            return exc

    texts = [huge if i % 4 == 0 else f"text number {i}".encode() for i in range(32)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(infer, texts))
    for text, result in zip(texts, results, strict=True):
        if text is huge:
            assert isinstance(result, InferenceServerException) and "tokenizer.max_text_bytes" in str(result)
        else:
            assert isinstance(result, np.ndarray) and result.shape == (1, 384) and np.isfinite(result).all()
