"""Every encoder family's tokenizer through TextTokenizer: the Hugging Face tokenizer's ids and token types, single
texts and pairs, on the whole corpus and on generated texts, long texts read from a bounded prefix.

The tokenizers are trained here (export/tokenizer_training.py: WordPiece for BERT, DistilBERT and MPNet,
byte-level BPE for RoBERTa and ModernBERT, Unigram for XLM-R and CamemBERT), plus the multilingual-e5 layout
(NFKC and a Replace of runs of spaces, then Metaspace alone) with NFKC in place of SentencePiece's character
map, and the real thing: SentencePiece Unigram models trained with XLM-R's nmt_nfkc map and converted by
transformers (SENTENCEPIECE_LAYOUTS; test_tokenizer_precompiled.py tests the map's own argument)."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

from export.tokenizer_training import (
    LAYOUTS,
    MULTILINGUAL_SENTENCES,
    SENTENCEPIECE_LAYOUTS,
    train_sentencepiece_tokenizer,
    train_tokenizer,
)
from loadtest.corpus import load_text
from model_repository.stages import ascii_path, prefix_encoding
from model_repository.stages.text_tokenizer import TextTokenizer
from tests.model.test_tokenization import SlowSpy

ROOT = Path(__file__).resolve().parents[2]
XLMR_JSON = "xlm-roberta-json"
TOKENIZERS = (*LAYOUTS, XLMR_JSON, *SENTENCEPIECE_LAYOUTS)
PATHS = {  # what the stage's log line says of each
    "bert": "ASCII fast path (WordPiece)",
    "distilbert": "ASCII fast path (WordPiece)",
    "mpnet": "ASCII fast path (WordPiece)",
    "roberta": "ASCII fast path (byte-level BPE)",
    "modernbert": "ASCII fast path (byte-level BPE)",
    "xlm-roberta": "ASCII fast path (Unigram)",
    "camembert": "ASCII fast path (Unigram)",
    XLMR_JSON: "ASCII fast path (Unigram)",
    "xlm-roberta-spm": "ASCII fast path (Unigram)",
    "camembert-spm": "ASCII fast path (Unigram)",
    "xlm-roberta-spm-json": "ASCII fast path (Unigram)",
}


def training_texts() -> list[str]:
    return load_text() + MULTILINGUAL_SENTENCES.read_text().splitlines()


@functools.cache
def trained(name: str) -> str:
    """The tokenizer `name` (a family, XLMR_JSON or a SentencePiece layout), trained once a session, as
    tokenizer.json text."""
    if name in SENTENCEPIECE_LAYOUTS:
        return train_sentencepiece_tokenizer(name, training_texts(), 3000).to_str()
    tokenizer = train_tokenizer("xlm-roberta" if name == XLMR_JSON else name, training_texts(), 3000)
    if name == XLMR_JSON:
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer.to_str()


def hf_tokenizer(name: str, max_tokens: int | None) -> Tokenizer:
    """The tokenizer as the stages load it (truncating to max_tokens, no padding); None: not truncating."""
    tokenizer = Tokenizer.from_str(trained(name))
    tokenizer.no_padding()
    if max_tokens:
        tokenizer.enable_truncation(max_tokens)
    return tokenizer


def rows(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    assert ids.dtype == np.int32 and lengths.dtype == np.int64 and len(ids) == lengths.sum()
    return [row.tolist() for row in np.split(ids, np.cumsum(lengths)[:-1])] if len(lengths) else []


def stage_singles(name: str, max_tokens: int, texts: list[str]) -> tuple[list, list]:
    """(TextTokenizer's rows, the Hugging Face tokenizer's ids) of texts."""
    tokenizer = hf_tokenizer(name, max_tokens)
    return rows(*TextTokenizer(tokenizer, max_tokens).encode(texts)), [e.ids for e in tokenizer.encode_batch(texts)]


def stage_pairs(name: str, max_tokens: int, queries: list[str], texts: list[str]) -> tuple[list, list]:
    """(TextTokenizer's (ids, types) rows, the Hugging Face tokenizer's) of (query, text) pairs."""
    tokenizer = hf_tokenizer(name, max_tokens)
    ids, lengths, types = TextTokenizer(tokenizer, max_tokens).encode_pairs(queries, texts)
    reference = tokenizer.encode_batch(list(zip(queries, texts, strict=True)))
    return list(zip(rows(ids, lengths), rows(types, lengths), strict=True)), [(e.ids, e.type_ids) for e in reference]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_stage_says_which_path_it_takes(name):
    text_tokenizer = TextTokenizer(hf_tokenizer(name, 128), 128)
    assert text_tokenizer.path.startswith(PATHS[name]) and text_tokenizer.path.endswith("read from a prefix")


def test_a_component_without_an_argument_is_named_and_its_texts_encoded_whole():
    tokenizer = hf_tokenizer("roberta", 16)
    tokenizer.normalizer = normalizers.Strip()
    text_tokenizer = TextTokenizer(tokenizer, 16)
    assert "no ASCII fast path: normalizer Strip" in text_tokenizer.path
    assert text_tokenizer.path.endswith("long texts encoded whole (normalizer Strip)")
    long = "the river runs " * 1000
    spy = SlowSpy(text_tokenizer)
    assert rows(*text_tokenizer.encode([long])) == [tokenizer.encode(long).ids] and spy.texts == [long]


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("max_tokens", [16, 256])
def test_the_corpus_gets_the_hugging_face_ids(name, max_tokens):
    texts = training_texts()
    text_tokenizer = TextTokenizer(hf_tokenizer(name, max_tokens), max_tokens)
    spy = SlowSpy(text_tokenizer)
    got = rows(*text_tokenizer.encode(texts))
    assert got == [e.ids for e in text_tokenizer.tokenizer.encode_batch(texts)]
    assert len(spy.texts) < len(texts) / 10, "nearly all of the corpus is ASCII and takes the fast path"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_corpus_as_pairs_gets_the_hugging_face_ids_and_types(name):
    texts = training_texts()
    got, reference = stage_pairs(name, 64, texts[::2], texts[1::2])
    assert got == reference


# Pieces of text: ASCII words, punctuation and contractions, every kind of whitespace and ASCII control character,
# words of other scripts, combining and compatibility characters, emoji, every family's added and special tokens
# (whole, in pieces, lowercased), SentencePiece's ▁, and words longer than WordPiece reads.
PIECES = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=12),
    st.sampled_from([*"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "'s", "'ll", "n't", "3.14", "U.S.A."]),
    st.sampled_from([" ", "  ", "   ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u3000"]),
    st.sampled_from(["\x00", "\x07", "\x7f", "\u200b", "\ufeff"]),
    st.sampled_from(["naïve", "café", "e\u0301", "東京", "Привет", "ﬁne", "①", "😀", "▁", "▁x", "ß", "İ"]),
    st.sampled_from(["<mask>", "[MASK]", "[mask]", "<s>", "</s>", "[CLS]", "[SEP]", "<pad>", "<unk>", "[UNK]"]),
    st.sampled_from(["<s>NOTUSED", "|||IP_ADDRESS|||", "<|endoftext|>", "<mas", "k>", "[MA", "SK]"]),
    st.integers(95, 140).map(lambda n: "y" * n),
)
TEXTS = st.one_of(st.lists(PIECES, max_size=60).map("".join), st.text(max_size=200))


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(TEXTS, min_size=1, max_size=6), max_tokens=st.integers(2, 48))
@example(texts=["", " ", "  x  ", "a <mask> b", " <mask>", "x  [MASK]", "\t\n", "▁ ▁", "a" * 120], max_tokens=8)
def test_generated_texts_get_the_hugging_face_ids(name, texts, max_tokens):
    got, reference = stage_singles(name, max_tokens, texts)
    assert got == reference


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(TEXTS, TEXTS), min_size=1, max_size=4),
    max_tokens=st.integers(8, 40),
    # Sides past the room, not so far that the reference's every combination of overflow windows takes long.
    long=st.sampled_from(["", "word " * 40, "wörd " * 41, "a,b" * 25]),
)
def test_generated_pairs_get_the_hugging_face_ids_and_types(name, pairs, max_tokens, long):
    """Pairs as they come, and with both sides overflowing (`long` after each side), odd rooms too."""
    queries, texts = [query for query, _ in pairs], [text for _, text in pairs]
    queries += [query + long for query in queries]
    texts += [long + text for text in texts]
    got, reference = stage_pairs(name, max_tokens, queries, texts)
    assert got == reference


@pytest.mark.parametrize(
    "name", ["bert", "roberta", "xlm-roberta", XLMR_JSON, "xlm-roberta-spm", "xlm-roberta-spm-json"]
)
def test_multi_megabyte_texts_are_read_from_a_bounded_prefix_with_the_whole_texts_ids(name, monkeypatch):
    """Two megabytes of words, ASCII (the fast path) and not (the Hugging Face tokenizer): each sees a prefix
    of at most two windows, and the ids are the whole text's."""
    max_tokens = 64
    window = prefix_encoding.PREFIX_CHARS_PER_TOKEN * max_tokens
    megabytes = 2 << 20
    english = " ".join(text for text in load_text() if text.isascii())
    texts = [(english * 3)[:megabytes], ("naïve café, über straße  " * 90_000)[:megabytes]]
    tokenizer = hf_tokenizer(name, max_tokens)
    fast_seen, slow_seen = [], []
    fast_ids = ascii_path.AsciiPath.ids

    def spied_ids(path, text, limit):
        fast_seen.append(len(text))
        return fast_ids(path, text, limit)

    monkeypatch.setattr(ascii_path.AsciiPath, "ids", spied_ids)

    class Spy:
        def __getattr__(self, attribute):
            return getattr(tokenizer, attribute)

        def encode_batch(self, batch, **options):
            slow_seen.extend(map(len, batch))
            return tokenizer.encode_batch(batch, **options)

    got = rows(*TextTokenizer(Spy(), max_tokens).encode(texts))
    assert fast_seen and max(fast_seen) <= window, fast_seen
    assert slow_seen and max(slow_seen) <= 2 * window, slow_seen
    assert got == [e.ids for e in tokenizer.encode_batch(texts)]


@pytest.mark.parametrize("name", sorted(prefix_encoding.SPACE_CUT_NORMALIZERS))
def test_space_cut_normalizers_never_end_a_character_in_whitespace(name):
    """What the cut before a space rests on: no character that is not whitespace normalizes to nothing or to a
    string ending in whitespace (newlines between the characters, which no normalizer joins to either side)."""
    characters = [chr(code) for code in range(sys.maxunicode + 1) if not 0xD800 <= code < 0xE000]
    characters = [char for char in characters if not char.isspace()]
    normalized = getattr(normalizers, name)().normalize_str("\n".join(characters)).split("\n")
    assert len(normalized) == len(characters)
    assert not [(char, out) for char, out in zip(characters, normalized, strict=True) if not out or out[-1].isspace()]


def test_training_is_the_same_in_every_process():
    """The trainers' hash-map order differs between processes: the vocabularies must not."""
    script = (
        "import hashlib, sys\n"
        "from tests.model.test_tokenizer_layouts import trained\n"
        "print(' '.join(hashlib.sha256(trained(n).encode()).hexdigest() for n in sys.argv[1:]))\n"
    )
    names = ["bert", "xlm-roberta", "roberta", "xlm-roberta-spm"]
    other = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, check=True, cwd=ROOT)
    assert other.stdout.split() == [hashlib.sha256(trained(name).encode()).hexdigest() for name in names]
