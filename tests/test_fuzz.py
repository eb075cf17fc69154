"""Property-based fuzzing (hypothesis) of the tokenizer stage's pieces, the client's encoding, and the server.

Bounded: a fixed number of examples each, derandomized so CI runs the same cases every time.
"""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from client.core import text_input
from model_repository.stages.padding import pad_sequences
from model_repository.stages.tokenization import load_tokenizer

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    rows=st.lists(st.lists(st.integers(0, 30521), min_size=1, max_size=40), min_size=1, max_size=12),
    buckets=st.lists(st.integers(2, 64), max_size=4, unique=True).map(sorted),
)
def test_padding_keeps_every_token_and_masks_the_rest(rows, buckets):
    ids, mask = pad_sequences(rows, 0, buckets)
    longest = max(map(len, rows))
    assert ids.shape[1] >= longest and (ids.shape[1] == longest or ids.shape[1] in buckets)
    for row, (row_ids, row_mask) in enumerate(zip(ids, mask, strict=True)):
        length = len(rows[row])
        assert list(row_ids[:length]) == rows[row] and row_mask[:length].all() and not row_mask[length:].any()


@FUZZ
@given(text=st.text(max_size=600), max_tokens=st.integers(2, 64))
def test_tokenizer_truncates_and_never_pads(exported, text, max_tokens):
    tokenizer = load_tokenizer(exported / "tokenizer.json", max_tokens)
    ids = tokenizer.encode(text).ids
    assert 2 <= len(ids) <= max_tokens
    assert ids[0] == 101 and ids[-1] == 102, "[CLS] ... [SEP] always, also after truncation"
    assert 0 not in ids, "no padding tokens"


@FUZZ
@given(texts=st.lists(st.text(max_size=200), min_size=1, max_size=8))
def test_client_encodes_any_unicode_losslessly(texts):
    tensor = text_input(grpcclient, texts)
    assert tensor.shape() == [len(texts), 1] and tensor.datatype() == "BYTES"
    raw = tensor._get_content()  # length-prefixed UTF-8, as sent on the wire
    decoded, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        decoded.append(raw[offset + 4 : offset + 4 + size].decode("utf-8"))
        offset += 4 + size
    assert decoded == texts


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
