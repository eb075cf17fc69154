"""SentencePiece's character map (the Precompiled normalizer of real XLM-R and CamemBERT checkpoints) in the
stages: the facts about the Rust normalizer that prefix_encoding.py's argument rests on, checked against it;
every cut the stage would make, held to the whole text's ids on texts made for the map's corners; the stage's
ids (the ASCII fast path among them) on such texts; and maps built here to break each condition checked at load.

test_tokenizer_layouts.py runs the SentencePiece layouts (export/tokenizer_training.py's SENTENCEPIECE_LAYOUTS:
nmt_nfkc maps converted by transformers) through its corpus, generated texts, pairs and multi-megabyte texts."""

from __future__ import annotations

import base64
import functools
import io
import re
import sys
import tempfile
import unicodedata
from pathlib import Path

import pytest
import sentencepiece
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Regex, Tokenizer, normalizers

from export.tokenizer_training import MULTILINGUAL_SENTENCES, SENTENCEPIECE_LAYOUTS
from model_repository.stages.ascii_path import ascii_path
from model_repository.stages.prefix_encoding import PREPEND, SPACE_CUT, SpaceCut, members, prefix_cut, state
from model_repository.stages.text_tokenizer import TextTokenizer
from tests.model.test_tokenizer_layouts import hf_tokenizer, rows, stage_pairs

# A map made to break the argument: keys whose replacement is empty or ends in a space, alone (k, w, a control
# character, a space, a Prepend character, which takes the next character of its cluster with it) and the
# shortest key of a cluster of several characters (q and its mark); then a Prepend character mapped to ASCII (a
# space after it is lost in its cluster), a harmless key of several characters (z and two marks), and CR mapped
# to a letter (CR LF, one cluster, maps to it alone).
ADVERSARIAL_RULES = {
    **{"q\u0301": " ", "k": "", "w": "w ", "\x01": "", "\xa0": " ", "\u0600": ""},
    **{"\u06dd": "in", "z\u0301\u0301": "Z", "\r": "R"},
}
ADVERSARIAL = ("adversarial", "adversarial-json")  # that map in place of nmt_nfkc's, layouts xlm-roberta-spm(-json)
NAMES = (*SENTENCEPIECE_LAYOUTS, *ADVERSARIAL)


@functools.cache
def rule_charsmap(rules: tuple[tuple[str, str], ...]) -> bytes:
    """A character map compiled by SentencePiece from rules (key, replacement) alone."""
    hexes = [" ".join(f"{ord(char):X}" for char in text) for rule in rules for text in rule]
    with tempfile.TemporaryDirectory() as folder:
        tsv = Path(folder) / "rules.tsv"
        tsv.write_text("".join(f"{key}\t{value}\n" for key, value in zip(hexes[::2], hexes[1::2], strict=True)))
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(["a b c"]),
            model_writer=model,
            vocab_size=8,
            hard_vocab_limit=False,
            normalization_rule_tsv=str(tsv),
            num_threads=1,
            minloglevel=2,
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    return proto.normalizer_spec.precompiled_charsmap


def tokenizer_of(name: str, max_tokens: int | None) -> Tokenizer:
    """A SentencePiece layout's tokenizer, or (ADVERSARIAL) one with ADVERSARIAL_RULES in place of its map."""
    if name not in ADVERSARIAL:
        return hf_tokenizer(name, max_tokens)
    tokenizer = hf_tokenizer("xlm-roberta-spm" if name == "adversarial" else "xlm-roberta-spm-json", max_tokens)
    charsmap = normalizers.Precompiled(rule_charsmap(tuple(ADVERSARIAL_RULES.items())))
    spaces = [normalizers.Replace(Regex(" {2,}"), " ")] if name == "adversarial-json" else []
    tokenizer.normalizer = normalizers.Sequence([charsmap, *spaces])
    return tokenizer


def nmt_nfkc() -> normalizers.Normalizer:
    return tokenizer_of("xlm-roberta-spm", None).normalizer


def test_the_layouts_are_the_real_checkpoints():
    """nmt_nfkc's map first (alone, or before a Replace of runs of spaces), then Metaspace."""
    for name in SENTENCEPIECE_LAYOUTS:
        tokenizer = tokenizer_of(name, None)
        parts = [part["type"] for part in members(state(tokenizer.normalizer), "normalizers")]
        splitters = [part["type"] for part in members(state(tokenizer.pre_tokenizer), "pretokenizers")]
        if name.endswith("-json"):
            assert (parts, splitters) == (["Precompiled", "Replace"], ["Metaspace"])
        else:
            assert (parts, splitters) == (["Precompiled"], ["WhitespaceSplit", "Metaspace"])
        assert tokenizer.normalizer.normalize_str("ﬁ\u3000x\x01") == "fi x", "nmt_nfkc: NFKC, spaces, controls"


def test_the_rust_normalizer_maps_each_cluster_as_the_argument_says():
    """A cluster under 6 bytes starting with a key: the shortest key's replacement, the rest dropped; longer
    ones character by character; each cluster on its own (prefix_encoding.py)."""
    normalize = nmt_nfkc().normalize_str
    assert normalize("\r") == normalize("\n") == " " and normalize("\r\n") == " ", "CR LF: one cluster, CR's map"
    assert normalize("\xa0\u0301") == " ", "no-break space (a key) and a mark: 4 bytes, the mark dropped"
    assert normalize("\xa0\u0301\u0301") == " \u0301\u0301", "6 bytes: character by character"
    assert normalize("\u200b\u0301") == " \u0301", "U+200B is a control: a cluster of its own"
    assert normalize("e\u0301 x") == "é x" and normalize("\x01\u0301") == "\u0301"
    adversarial = normalizers.Precompiled(rule_charsmap(tuple(ADVERSARIAL_RULES.items()))).normalize_str
    assert adversarial("\u0600ab") == "b", "Prepend joins the next character to its cluster, its key replaces both"
    assert adversarial("\u0600 b") == "b", "... a space too: no cluster break after a Prepend character"
    assert adversarial("aq\u0301 b") == "a  b" and adversarial("z\u0301\u0301") == "Z"


def test_prepend_holds_every_character_after_which_the_rust_tokenizer_puts_no_break_before_a_space():
    """Over all of Unicode: a map sending every character but the space, the newline and 0 to "0" shows the
    clusters of "X " (a cluster keyed by X maps to "0" alone); and no control character (Cc) starts a cluster
    of two (GB4), which the cut's 4 characters before it leave out."""
    codes = [code for code in range(1, sys.maxunicode + 1) if not 0xD800 <= code < 0xE000 and code not in (32, 10, 48)]
    normalize = normalizers.Precompiled(rule_charsmap(tuple((chr(code), "0") for code in codes))).normalize_str
    joined = {
        chr(code)
        for code, out in zip(codes, normalize("\n".join(f"{chr(c)} " for c in codes)).split("\n"), strict=True)
        if out != "0 "
    }
    prepend = re.compile(f"[{PREPEND}]")
    assert joined and all(prepend.fullmatch(char) for char in joined), sorted(joined)
    controls = [chr(code) for code in codes if unicodedata.category(chr(code)) == "Cc"]
    assert normalize("\n".join(f"{char}\u0301" for char in controls)).split("\n") == ["00"] * len(controls)


def test_the_cut_avoids_each_character_whose_map_may_end_a_prefix_in_whitespace():
    """Over all of Unicode, each character a cluster of its own (between NULs, which no map holds): no cut after
    one nmt_nfkc maps to nothing or to a string ending in whitespace; one after each other character of the
    multilingual sentences (the keys were read off the map's trie, not every character avoided)."""
    cut, described = prefix_cut(tokenizer_of("xlm-roberta-spm-json", 64))
    chars = [chr(code) for code in range(1, sys.maxunicode + 1) if not 0xD800 <= code < 0xE000]
    mapped = nmt_nfkc().normalize_str("\0".join(chars)).split("\0")
    spaced = {char for char, out in zip(chars, mapped, strict=True) if not out or out[-1].isspace()}
    assert isinstance(cut, SpaceCut) and described == "long texts read from a prefix"
    assert len(spaced) > 50 and [char for char in spaced if cut.last_cut(f"ab{char} c", 9) == 3] == []
    prepend = re.compile(f"[{PREPEND}]")
    others = set(MULTILINGUAL_SENTENCES.read_text()) - spaced - set(" \n")
    assert [char for char in others if cut.last_cut(f"ab{char} c", 9) != 3 and not prepend.match(char)] == []


def test_the_cut_avoids_the_first_characters_of_keys_that_map_to_whitespace_and_prepend():
    cut, _ = prefix_cut(tokenizer_of("adversarial-json", 64))
    assert [cut.last_cut(f"ab{char} d", 9) for char in "qkwz\u0600\u06ddx"] == [-1, -1, -1, 3, -1, -1, 3]
    assert cut.last_cut("q\u0301 d", 9) == cut.last_cut("aq\u0301 d", 9) == -1, "q's key, a cluster of two"
    assert cut.last_cut("q\u0301xyz d", 9) == -1 and cut.last_cut("q\u0301xyzv d", 9) == 6, "4 characters back"
    assert cut.last_cut("\x01 d", 9) == -1 and cut.last_cut("\x01xy d", 9) == 3, "a control: its own cluster"


@pytest.mark.parametrize(
    ("rules", "layout", "path"),
    [
        ({" x": "y"}, "xlm-roberta-spm-json", "long texts encoded whole (normalizer Precompiled: a key of its "),
        ({"x": "é"}, "xlm-roberta-spm", "no ASCII fast path: normalizer Precompiled maps ASCII to 'é'"),
        (None, "xlm-roberta-spm-json", "long texts encoded whole (normalizer Precompiled after another one)"),
    ],
)
def test_a_map_the_argument_does_not_cover_is_named_and_its_texts_read_whole(rules, layout, path):
    tokenizer = tokenizer_of(layout, 16)
    if rules is None:  # nmt_nfkc's map after NFKC
        charsmap = members(state(tokenizer.normalizer), "normalizers")[0]["precompiled_charsmap"]
        precompiled = normalizers.Precompiled(base64.b64decode(charsmap))
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), precompiled])
    else:
        tokenizer.normalizer = normalizers.Precompiled(rule_charsmap(tuple(rules.items())))
    text_tokenizer = TextTokenizer(tokenizer, 16)
    assert path in text_tokenizer.path
    texts = ["the river runs  x y " * 200, " x y é " * 300, "x"]
    assert rows(*text_tokenizer.encode(texts)) == [e.ids for e in tokenizer.encode_batch(texts)]


def test_the_plain_cut_would_read_a_wrong_start_where_the_maps_cut_does_not():
    """What the cases below catch: a cut right before any space after a character that is not whitespace
    (SPACE_CUT, exact without the map) makes prefixes that tokenize otherwise than the whole text's start."""
    cases = {  # a text, and where the plain cut falls in it
        "xlm-roberta-spm-json": ("the river \x01 runs to the sea", 11),  # the prefix maps to "the river "
        "adversarial": ("the\u0600 re runs to the sea", 4),  # the Prepend character's key takes the space: "there"
        "adversarial-json": ("the riverq\u0301 runs to the sea", 11),  # q's key takes the mark, maps to a space
    }
    for name, (text, plain) in cases.items():
        tokenizer = tokenizer_of(name, None)
        whole = tokenizer.encode(text, add_special_tokens=False).ids
        assert SPACE_CUT.last_cut(text, plain) == plain
        for cut in (SPACE_CUT, prefix_cut(tokenizer)[0]):
            prefix, _ = cut(text, plain, 1)
            head = tokenizer.encode(prefix, add_special_tokens=False).ids
            assert (whole[: len(head)] == head) == (cut is not SPACE_CUT), (name, prefix)


# Pieces for the map's corners: words of the vocabulary (a stray ▁ before one shows) and not, whitespace and
# what nmt_nfkc maps to a space (CR LF too), control characters (it drops most), marks and joiners that extend a
# cluster (after spaces too), Prepend characters, U+2581 and U+FFFD (mapped to a space), compatibility
# characters, compositions and clusters of several characters, the adversarial map's keys, added tokens.
PIECES = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789", min_size=1, max_size=10),
    st.sampled_from("the of and to in is it for that with as be on by this are from there format into".split()),
    st.sampled_from([*"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "'s", "n't", "3.14"]),
    st.sampled_from([" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\r", "\x0b", "\x0c", "\x85", "\xa0", "\u3000"]),
    st.sampled_from(["\u2009", "\u200b", "\u200c", "\u200e", "\u2028", "\ufeff", "\x00", "\x01", "\x07", "\x1c"]),
    st.sampled_from(["\x1f", "\x7f", "\x8f", "\x9f", "\u0301", "\u0308", "\u0301\u0301", "\u093f", "\u200d"]),
    st.sampled_from(["\U0001f3fb", "\ufe0f", "\u0600", "\u0605", "\u06dd", "\u070f", "\u08e2", "\u0d4e"]),
    st.sampled_from(["\U000110bd", "\U00011a3a", "\U000113d1", "▁", "\ufffd", "ﬁ", "①", "㍿", "¨", "´", "ｶﾞ"]),
    st.sampled_from(["e\u0301", "é", "Å", "ǅ", "한국어", "東京", "😀", "🇫🇷", "👩\u200d💻", "naïve", "İ", "ß"]),
    st.sampled_from(["q\u0301", "k", "w", "z\u0301\u0301", "<mask>", " <mask>", "<mask> ", "<s>", "</s>"]),
    st.sampled_from(["<pad>", "<unk>", "<mas", "k>", "<s>NOTUSED", "y" * 120]),
)
ASCII_PIECES = PIECES.filter(str.isascii)
TEXTS = st.one_of(st.lists(PIECES, max_size=50).map("".join), st.lists(ASCII_PIECES, max_size=50).map("".join))
FUZZ = settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(text=TEXTS)
# Each corner before a space and a word of the vocabulary, where a wrong cut shows as a stray ▁ or a word lost.
@example(
    text="the k the w the q\u0301 the \x01 the\xa0\u0301 the \u0600x the \u06dd to the z\u0301\u0301 the\r\n the "
    "\u200b\u0301 the ▁ the \ufffd the <mask> the é\u0301 the \u0d4e the\u0301 the"
)
def test_every_cut_reads_the_start_of_the_whole_text(name, text):
    """Each prefix the stage may read in place of the text (its cut at each window length) tokenizes to the
    first ids of the whole text."""
    tokenizer = tokenizer_of(name, None)
    cut, _ = prefix_cut(tokenizer)
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    for prefix in {cut(text, length, 1)[0] for length in range(len(text))} - {text}:
        head = tokenizer.encode(prefix, add_special_tokens=False).ids
        assert whole[: len(head)] == head, prefix


@pytest.mark.parametrize("rules", [None, ADVERSARIAL_RULES, {"\r\n": "X"}, {"é": "e"}])  # None: nmt_nfkc
@FUZZ
@given(text=st.text(alphabet=[chr(code) for code in range(128)], max_size=80))
@example(text="a\r\nb\r\r\n\n\rc\x00\x01\x7f\t\x0b\x0c\x1c")
def test_the_ascii_fast_path_maps_ascii_as_the_rust_normalizer(rules, text):
    """Each character's replacement, CR LF's for CR LF: the normalizer's own output (the map alone, no other
    step before the pre-tokenizer); a map of CR LF alone, and one of no ASCII at all, too."""
    tokenizer = tokenizer_of("xlm-roberta-spm", 64)
    if rules:
        tokenizer.normalizer = normalizers.Precompiled(rule_charsmap(tuple(rules.items())))
    fast, _ = ascii_path(tokenizer, 64, None)
    assert fast.reading.normalize(text) == tokenizer.normalizer.normalize_str(text)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(texts=st.lists(TEXTS, min_size=1, max_size=6), max_tokens=st.integers(2, 48))
@example(texts=["the\r\nriver", "x\r\n\r\ny z", "a\r\rb\n\nc", "q\u0301x the <mask> there"], max_tokens=8)
def test_generated_texts_get_the_hugging_face_ids(name, texts, max_tokens):
    """Through TextTokenizer: the ASCII fast path (its map a table, long texts cut) and the Hugging Face
    tokenizer reading long texts from a prefix."""
    tokenizer = tokenizer_of(name, max_tokens)
    assert rows(*TextTokenizer(tokenizer, max_tokens).encode(texts)) == [e.ids for e in tokenizer.encode_batch(texts)]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(st.tuples(TEXTS, TEXTS), min_size=1, max_size=4), max_tokens=st.integers(8, 40))
def test_generated_pairs_get_the_hugging_face_ids_and_types(name, pairs, max_tokens):
    if name in SENTENCEPIECE_LAYOUTS:
        got, reference = stage_pairs(name, max_tokens, [query for query, _ in pairs], [text for _, text in pairs])
        assert got == reference
        return
    tokenizer = tokenizer_of(name, max_tokens)
    ids, lengths, types = TextTokenizer(tokenizer, max_tokens).encode_pairs(*map(list, zip(*pairs, strict=True)))
    reference = tokenizer.encode_batch(pairs)
    assert list(zip(rows(ids, lengths), rows(types, lengths), strict=True)) == [(e.ids, e.type_ids) for e in reference]
