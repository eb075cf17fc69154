"""The API front's windows over long texts (serving/api/chunking.py): spans that cover the text, overlapping by the
tokens asked, each window re-tokenizing to at most max_tokens, on ASCII, accented, CJK and emoji text, with the
default model's WordPiece tokenizer and byte-level BPE and Unigram ones (trained in
tests/model/test_tokenizer_layouts.py) in its place, at the model's window and at a small one that makes many."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from serving.api.chunking import (
    Chunking,
    document_windows,
    requested_chunking,
    text_room,
    text_spans,
    window_texts,
)
from serving.api.models import served_model
from serving.api.schema import ApiError
from settings import Deployment
from tests.model.test_tokenizer_layouts import hf_tokenizer

TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun. " * 12,
    "accents": "Ünïcödé façade — déjà vu, naïve café crème brûlée. " * 12,
    "cjk": "深度学习模型需要大量的数据。自然语言处理很有趣。" * 12,
    "emoji": "🙂🎉 party time 👩‍👩‍👧 family 🇫🇷 flag " * 12,
}


@pytest.fixture(scope="module")
def default_model(settings, repository):
    return served_model(Deployment((settings,)), settings, repository)


def with_window(model, max_tokens: int):
    """The model as if its max_tokens were `max_tokens`: a small window makes many windows of a short text."""
    return dataclasses.replace(model, spec=dataclasses.replace(model.spec, max_tokens=max_tokens))


@pytest.fixture(scope="module", params=["wordpiece", "roberta", "xlm-roberta"])
def model(request, default_model):
    """The default model (WordPiece), or with a byte-level BPE or Unigram tokenizer in its place."""
    if request.param == "wordpiece":
        return default_model
    max_tokens = default_model.max_tokens
    tokenizer, whole = hf_tokenizer(request.param, max_tokens), hf_tokenizer(request.param, None)
    return dataclasses.replace(default_model, tokenizer=tokenizer, whole=whole)


def token_positions(model, text: str, start: int, end: int) -> set[int]:
    """The positions of the text's own tokens whose characters lie within [start, end)."""
    offsets = model.whole.encode(text, add_special_tokens=False).offsets
    return {i for i, (first, last) in enumerate(offsets) if start <= first and last <= end}


def countable(model, script: str) -> bool:
    """Whether each token's characters are its own: in ASCII text, and with WordPiece in any script (byte-level BPE
    spells a character in several tokens; Unigram's normalization maps several tokens onto one accented one)."""
    return script == "ascii" or '"WordPiece"' in model.whole.to_str()


def assert_windows(model, text: str, overlap: int, countable: bool) -> list[tuple[int, int]]:
    """Spans that cover the text, move forward and re-tokenize to at most max_tokens; where `countable` (no two
    tokens share a character), each holds at most text_room tokens and shares `overlap` with the next."""
    spans = text_spans(model, text, overlap)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    covered = set().union(*(range(start, end) for start, end in spans))
    assert all(text[i].isspace() for i in set(range(len(text))) - covered), "only whitespace between windows"
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(spans)), "windows move forward"
    limit = model.max_tokens
    assert max(len(model.whole.encode(text[start:end]).ids) for start, end in spans) <= limit
    if countable:
        tokens = [token_positions(model, text, start, end) for start, end in spans]
        assert max(len(positions) for positions in tokens) <= text_room(model)
        assert [len(a & b) for a, b in itertools.pairwise(tokens)] == [overlap] * (len(spans) - 1)
    return spans


@pytest.mark.parametrize("overlap", [0, 3, 7])
@pytest.mark.parametrize("script", TEXTS)
def test_small_windows_cover_the_text_overlap_as_asked_and_fit(model, script, overlap):
    small = with_window(model, 16)
    spans = assert_windows(small, TEXTS[script], overlap, countable(model, script))
    assert len(spans) > 5


@pytest.mark.parametrize("script", TEXTS)
def test_model_windows_cover_a_long_text_and_fit(model, script):
    text = TEXTS[script] * 8
    assert len(model.whole.encode(text).ids) > 2 * model.max_tokens
    assert len(assert_windows(model, text, 32, countable(model, script))) >= 3


@pytest.mark.parametrize("text", ["", "   ", "A short text.", "深度学习 🙂", TEXTS["ascii"][:200]])
def test_a_text_within_one_window_is_one_window_spanning_it_all(model, text):
    assert text_spans(model, text, 32) == [(0, len(text))]


def test_a_byte_level_character_cut_between_its_tokens_shrinks_the_window_to_fit(default_model):
    roberta = dataclasses.replace(default_model, whole=hf_tokenizer("roberta", None))
    text = "👩‍👩‍👧" * 40  # each a run of byte tokens sharing characters
    for max_tokens in (8, 16, 32):
        small = with_window(roberta, max_tokens)
        spans = assert_windows(small, text, 1, countable=False)
        assert len(spans) > 1


def test_windows_of_several_texts_keep_their_text_and_the_request_limit(default_model):
    small = with_window(default_model, 16)
    texts = ["one short text", TEXTS["ascii"], "深度学习 🙂"]
    windows = document_windows(small, texts, 2, "input")
    assert [w.text_index for w in windows][:1] == [0] and windows[-1].text_index == 2
    assert window_texts(texts, windows)[-1] == "深度学习 🙂".encode()
    assert window_texts(texts, windows)[1] == TEXTS["ascii"][windows[1].start : windows[1].end].encode()
    few = dataclasses.replace(small, limits=dataclasses.replace(small.limits, max_inputs=len(windows) - 1))
    with pytest.raises(ApiError, match=rf"'input' makes {len(windows)} windows; at most {len(windows) - 1}") as refused:
        document_windows(few, texts, 2, "input")
    assert refused.value.status == 413


@pytest.mark.parametrize(
    ("chunking", "extra", "param", "message"),
    [
        ([32], {}, "chunking", "must be an object"),
        ({"overlap": 3}, {}, "chunking.overlap", "unknown fields"),
        ({"overlap_tokens": -1}, {}, "chunking.overlap_tokens", "in 0..253"),
        ({"overlap_tokens": 254}, {}, "chunking.overlap_tokens", "window holds 254"),
        ({"overlap_tokens": 2.5}, {}, "chunking.overlap_tokens", "must be an integer"),
        ({"overlap_tokens": True}, {}, "chunking.overlap_tokens", "must be an integer"),
        ({}, {"prompt_name": "query"}, "prompt_name", "does not combine with 'chunking'"),
        ({}, {"truncation_direction": "Left"}, "truncation_direction", "does not combine"),
        ({"late_chunk_tokens": 0}, {}, "chunking.late_chunk_tokens", "in 1..254"),
        ({"late_chunk_tokens": 255}, {}, "chunking.late_chunk_tokens", "window holds 254"),
        ({"late_chunk_tokens": True}, {}, "chunking.late_chunk_tokens", "must be an integer"),
    ],
)
def test_bad_chunking_fields_are_named(default_model, chunking, extra, param, message):
    with pytest.raises(ApiError) as refused:
        requested_chunking({"chunking": chunking, **extra}, default_model)
    assert refused.value.status == 400 and refused.value.param == param and message in refused.value.message


def test_no_chunking_asked_is_none_and_an_empty_object_no_overlap(default_model):
    assert requested_chunking({"input": "x"}, default_model) is None
    assert requested_chunking({"chunking": {}}, default_model) == Chunking(0, None)
    assert requested_chunking({"chunking": {"overlap_tokens": 253}}, default_model) == Chunking(253, None)
    late = {"chunking": {"overlap_tokens": 8, "late_chunk_tokens": 254}}
    assert requested_chunking(late, default_model) == Chunking(8, 254)
