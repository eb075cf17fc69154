"""The ASCII fast path: the Hugging Face tokenizer's ids for an ASCII text at a fraction of its cost.

For ASCII, each tokenizer's normalizer and pre-tokenizer reduce to a few string operations and one regular
expression, and each word's ids are the tokenizer model's own (its `tokenize`), kept in a bounded cache: the Rust
tokenizer spends most of its time tracking character offsets, which serving never reads. BERT's words never cross
whitespace, so its cache holds whole whitespace chunks (1.3x cold and 1.7x warm on the corpus against a cache per
word: docs/results/cpu-2026-12-05/tokenizer-chunks/). Three pre-tokenizers have one: BERT's (WordPiece), GPT-2's
ByteLevel (byte-level BPE: RoBERTa, ModernBERT) and Metaspace (SentencePiece Unigram or BPE: XLM-R, CamemBERT).
SentencePiece's character map (the Precompiled normalizer of real XLM-R and CamemBERT checkpoints) maps a text
cluster by cluster (prefix_encoding.py says how): an ASCII text's clusters are its characters but for CR LF, one
(UAX #29 GB3), so on ASCII the map is a table of each ASCII character's and CR LF's replacement, asked of the
normalizer itself at load. A text holding an added token, [MASK] say, is not taken (the Hugging Face tokenizer
matches those first).
tests/model/test_tokenizer_layouts.py and test_tokenizer_precompiled.py hold every path to the Hugging Face ids.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from tokenizers import Tokenizer, normalizers
from tokenizers.models import BPE, Unigram
from tokenizers.pre_tokenizers import ByteLevel

from . import prefix_encoding
from .bert_prefix import CUT_CHARS, is_bert
from .prefix_encoding import RUNS_OF_SPACES, Cut, SpaceCut, members, state
from .special_tokens import Template, longest_first, special_template

# BERT's normalizer drops the ASCII control characters but tab, newline and carriage return (which it reads as
# spaces); str.translate deletes what maps to None.
ASCII_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127])
# Words of an ASCII text the way BERT's pre-tokenizer splits it: runs of letters and digits, and each other
# visible character (all of them are punctuation to BERT) on its own.
BERT_WORDS = {True: re.compile(r"[a-z0-9]+|[^a-z0-9 \t\n\r]"), False: re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 \t\n\r]")}
# ASCII whitespace to the Rust tokenizer (Unicode White_Space, without the \x1c-\x1f of Python's isspace).
WHITESPACE = "\t\n\x0b\x0c\r "
# GPT-2's expression (ByteLevel) on ASCII: \p{L} is [A-Za-z], \p{N} [0-9], \s WHITESPACE.
GPT2_WORDS = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{WHITESPACE}A-Za-z0-9]+|[{WHITESPACE}]+(?![^{WHITESPACE}])"
    rf"|[{WHITESPACE}]+"
)
# Metaspace's words: each space (its ▁) with what follows up to the next one, and what comes before the first.
METASPACE_WORDS = re.compile(r" [^ ]*|[^ ]+")
WHITESPACE_SPLIT_WORDS = re.compile(rf"[^{WHITESPACE}]+")
RUNS_OF_SPACES_PATTERN = re.compile(" {2,}")
UNICODE_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "StripAccents"})  # ASCII passes them unchanged
# Words whose ids are kept for reuse, per tokenizer (natural text has far fewer distinct words), up to this long.
WORD_CACHE_SIZE = 1 << 18
CACHED_WORD_CHARS = 64


@dataclass(frozen=True)
class Reading:
    """A tokenizer's normalizer, pre-tokenizer and model as they act on ASCII text."""

    kind: str  # what the stage's log calls it: WordPiece, byte-level BPE, Unigram
    normalize: Callable[[str], str]
    words: re.Pattern  # the pre-tokenizer's words in the normalized text
    word_ids: Callable[[str], tuple[int, ...]]  # a word's ids, from the model
    added_raw: bool  # whether normalizing can hide an added token the raw text holds
    # Where a long text's prefix may end within n characters, or -1: BERT's here, the others' from prefix_encoding.
    last_cut: Callable[[str, int], int] | None
    # Whether no word spans whitespace, which the words drop (BERT's): then a whitespace-split chunk's ids are its
    # words', cached per chunk, and str.split finds the chunks at a fraction of the words' expression.
    chunked: bool = False


class AsciiPath:
    """The ASCII fast path of a tokenizer truncating to max_tokens: ids and pairs as the tokenizer has them."""

    def __init__(
        self, reading: Reading, added: re.Pattern | None, template: Template, max_tokens: int, pairs: bool
    ) -> None:
        self.reading = reading
        self.added = added  # any added token, as typed or normalized
        self.template = template
        self.max_tokens = max_tokens
        self.room = max_tokens - template.single_specials
        self.pairs = pairs  # whether pairs take it too (the tokenizer truncates them longest first, as it does)
        self._cache: dict[str, tuple[int, ...]] = {}
        self._chunks: dict[str, tuple[int, ...]] = {}  # a chunked reading's ids per chunk (Reading.chunked)

    @property
    def kind(self) -> str:
        return self.reading.kind

    def encode(self, text: str) -> list[int] | None:
        """An ASCII text's ids, special tokens around them; None if it holds an added token."""
        inner = self.prefix_ids(text, self.room)
        return None if inner is None else self.template.wrap(inner)

    def encode_pair(self, query: str, text: str) -> tuple[list[int], list[int]] | None:
        """An ASCII pair's ids and token types; None if a side holds an added token, or where the whole sides
        would decide it."""
        room = self.max_tokens - self.template.pair_specials
        first, second = self.prefix_ids(query, room + 1), self.prefix_ids(text, room + 1)
        if first is None or second is None:
            return None
        if len(first) > room and len(second) > room and room % 2:
            return None  # which one is longer decides who keeps the odd token: only the whole texts can say
        keep_first, keep_second = longest_first(len(first), len(second), room)
        return self.template.wrap_pair(first[:keep_first], second[:keep_second])

    def ids(self, text: str, limit: int) -> list[int] | None:
        """The first `limit` ids of an ASCII text, no special tokens; None if it holds an added token."""
        reading = self.reading
        normalized = reading.normalize(text)
        if self.added and (self.added.search(normalized) or (reading.added_raw and self.added.search(text))):
            return None
        if not reading.chunked:
            return self._word_ids(normalized, limit)
        ids: list[int] = []
        chunks = normalized.split()
        for chunk, pieces in zip(chunks, map(self._chunks.get, chunks), strict=True):
            if pieces is None:
                if len(chunk) > CACHED_WORD_CHARS:  # read lazily, up to what the text can still take
                    pieces = self._word_ids(chunk, limit - len(ids))
                else:
                    pieces = tuple(self._word_ids(chunk, CACHED_WORD_CHARS))  # all: at most an id a character
                    if len(self._chunks) < WORD_CACHE_SIZE:
                        self._chunks[chunk] = pieces
            ids += pieces
            if len(ids) >= limit:
                del ids[limit:]
                break
        return ids

    def _word_ids(self, normalized: str, limit: int) -> list[int]:
        """The first `limit` ids of a normalized text, word by word, from the cache where it has the word."""
        reading = self.reading
        ids: list[int] = []
        cache = self._cache
        for word in reading.words.finditer(normalized):  # lazily: a text without whitespace stops at the limit too
            word = word.group()
            pieces = cache.get(word)
            if pieces is None:
                pieces = reading.word_ids(word)
                if len(cache) < WORD_CACHE_SIZE and len(word) <= CACHED_WORD_CHARS:
                    cache[word] = pieces
            ids += pieces
            if len(ids) >= limit:
                del ids[limit:]
                break
        return ids

    def prefix_ids(self, text: str, limit: int) -> list[int] | None:
        """ids, a long text first read up to its last cut within PREFIX_CHARS_PER_TOKEN * limit characters (the
        words before it are whole, as in prefix_encoding.py): when that prefix fills the limit, its ids are the
        whole text's."""
        window = prefix_encoding.PREFIX_CHARS_PER_TOKEN * limit
        if self.reading.last_cut and len(text) > window:
            cut = self.reading.last_cut(text, window)
            if cut > 0:
                ids = self.ids(text[:cut], limit)
                if ids is None or len(ids) == limit:
                    return ids
        return self.ids(text, limit)


def _bert_last_cut(text: str, window: int) -> int:
    return max(text.rfind(char, 0, window) for char in CUT_CHARS)


def _trie_pattern(words: set[str]) -> re.Pattern | None:
    """A pattern matching any of words, as a trie (an alternation of a hundred tokens is ten times slower)."""
    words = {word for word in words if not any(other != word and other in word for other in words)}
    tree: dict = {}
    for word in words:
        node = tree
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def branch(node: dict) -> str:
        if "" in node:  # a word ends here, and none goes on (each holds no other)
            return ""
        options = [re.escape(char) + branch(child) for char, child in sorted(node.items())]
        return options[0] if len(options) == 1 else f"(?:{'|'.join(options)})"

    return re.compile(branch(tree)) if tree else None


def _charsmap_on_ascii(charsmap: bytes) -> tuple[Callable[[str], str] | None, str]:
    """SentencePiece's character map on ASCII text (each character's replacement, CR LF's for CR LF), or None
    and why not: where it maps an ASCII character to a character that is not ASCII, which the steps after it
    and the pre-tokenizers would not pass unchanged."""
    charsmap_normalizer = normalizers.Precompiled(charsmap)
    table = {code: charsmap_normalizer.normalize_str(chr(code)) for code in range(128)}
    crlf = charsmap_normalizer.normalize_str("\r\n")
    for text in [*table.values(), crlf]:
        if not text.isascii():
            return None, f"normalizer Precompiled maps ASCII to {text!r}"
    table = {code: text for code, text in table.items() if text != chr(code)}
    # Finds a character to map faster than translate goes through the text.
    mapped = re.compile(f"[{''.join(re.escape(chr(code)) for code in table)}]") if table else None

    def charsmap_map(text: str) -> str:
        if "\r\n" in text:
            return crlf.join(part.translate(table) for part in text.split("\r\n"))
        return text.translate(table) if mapped and mapped.search(text) else text

    return charsmap_map, ""


def _ascii_normalizer(tokenizer: Tokenizer) -> tuple[Callable[[str], str] | None, bool, str]:
    """(normalize, whether it may hide an added token, why there is none) for a normalizer on ASCII text."""
    steps, parts, added_raw = [], members(state(tokenizer.normalizer), "normalizers"), False
    for part in parts:
        if part == RUNS_OF_SPACES:
            steps.append(lambda text: RUNS_OF_SPACES_PATTERN.sub(" ", text) if "  " in text else text)
            added_raw = True
        elif part["type"] == "Lowercase":
            steps.append(str.lower)
        elif part["type"] == "Precompiled":
            charsmap_map, refusal = _charsmap_on_ascii(base64.b64decode(part["precompiled_charsmap"]))
            if charsmap_map is None:
                return None, False, refusal
            steps.append(charsmap_map)
            added_raw = True
        elif part["type"] not in UNICODE_NORMALIZERS:
            return None, False, f"normalizer {part['type']}"

    def normalize(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return normalize, added_raw, ""


def _reading(tokenizer: Tokenizer) -> tuple[Reading | None, str]:
    """How the tokenizer reads ASCII text, or None and why it is not known here."""
    model = tokenizer.model
    if is_bert(tokenizer):
        normalizer = tokenizer.normalizer
        if not normalizer.clean_text:
            return None, "BertNormalizer without clean_text"
        lowercase = bool(normalizer.lowercase)
        unk = (tokenizer.token_to_id(model.unk_token),)
        if unk == (None,):
            return None, f"WordPiece's {model.unk_token} not in the vocabulary"

        def wordpiece(word: str) -> tuple[int, ...]:  # a longer word is one [UNK], as WordPiece has it
            return unk if len(word) > model.max_input_chars_per_word else tuple(t.id for t in model.tokenize(word))

        def normalize(text: str) -> str:
            if not text.isprintable():  # only then may it hold a control character (a C scan, 10x translate's speed)
                text = text.translate(ASCII_CONTROL)
            return text.lower() if lowercase else text

        return Reading("WordPiece", normalize, BERT_WORDS[lowercase], wordpiece, False, _bert_last_cut, True), ""
    normalize, added_raw, refusal = _ascii_normalizer(tokenizer)
    if normalize is None:
        return None, refusal
    if not isinstance(model, (BPE, Unigram)) or (isinstance(model, BPE) and model.dropout):
        return None, f"model {type(model).__name__}"
    splitters = members(state(tokenizer.pre_tokenizer), "pretokenizers")
    kinds = [part["type"] for part in splitters]
    if kinds == ["ByteLevel"] and splitters[0]["use_regex"] and not splitters[0]["add_prefix_space"]:
        byte_level = ByteLevel(add_prefix_space=False, use_regex=False)
        chars = {code: byte_level.pre_tokenize_str(chr(code))[0][0] for code in range(128)}
        word_ids = _model_ids(model, lambda word: word.translate(chars))
        return Reading("byte-level BPE", normalize, GPT2_WORDS, word_ids, added_raw, None), ""
    if kinds[-1:] == ["Metaspace"] and splitters[-1]["split"] and splitters[-1]["prepend_scheme"] != "first":
        kind, metaspace = type(model).__name__, splitters[-1]["replacement"]
        prepend = splitters[-1]["prepend_scheme"] == "always"
        if kinds == ["WhitespaceSplit", "Metaspace"]:  # each word a split of its own, given its ▁
            head = metaspace if prepend else ""
            word_ids = _model_ids(model, lambda word: head + word)
            return Reading(kind, normalize, WHITESPACE_SPLIT_WORDS, word_ids, added_raw, None), ""
        if kinds == ["Metaspace"]:

            def spaced(text: str) -> str:  # Metaspace's ▁ before the first word
                text = normalize(text)
                return " " + text if prepend and text and text[0] != " " else text

            word_ids = _model_ids(model, lambda word: word.replace(" ", metaspace))
            return Reading(kind, spaced, METASPACE_WORDS, word_ids, added_raw, None), ""
    return None, f"pre-tokenizer {' + '.join(kinds) or 'none'}"


def _model_ids(model, spelled: Callable[[str], str]) -> Callable[[str], tuple[int, ...]]:
    """A word's ids: the model's tokens of the word as the pre-tokenizer hands it over (spelled)."""
    return lambda word: tuple(token.id for token in model.tokenize(spelled(word)))


def ascii_path(tokenizer: Tokenizer, max_tokens: int, cut: Cut | None) -> tuple[AsciiPath | None, str]:
    """The ASCII fast path of the tokenizer truncating to max_tokens, or None and why it has none. cut:
    prefix_encoding.py's cut for the tokenizer (None: there is none, and its added tokens may straddle one, so
    long texts are read whole)."""
    reading, refusal = _reading(tokenizer)
    if reading is None:
        return None, refusal
    truncation, template = tokenizer.truncation, special_template(tokenizer)
    if not (truncation and truncation["direction"] == "right" and truncation["max_length"] == max_tokens):
        return None, f"truncation {truncation}"
    if template is None or template.single_specials > max_tokens:
        return None, f"post-processor {type(tokenizer.post_processor).__name__}"
    contents = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content.isascii() and t.content]
    added = _trie_pattern({form for content in contents for form in (content, reading.normalize(content))})
    pairs = truncation["strategy"] == "longest_first" and template.pair_specials <= max_tokens
    last_cut = None if cut is None else cut.last_cut if isinstance(cut, SpaceCut) else reading.last_cut
    return AsciiPath(replace(reading, last_cut=last_cut), added, template, max_tokens, pairs), ""
