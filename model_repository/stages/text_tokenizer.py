"""Texts -> token ids. `TextTokenizer` is what the stages call: a batch of texts in, the token ids of every
text packed into one int32 array plus each text's length out, truncated to max_tokens, identical to the Hugging
Face fast tokenizer's ids (tests/model/test_fuzz.py holds the two to that on generated texts and on the corpus).
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import unicodedata
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

from common.hf_tokenizer import load_tokenizer

# A text longer than this many characters per kept token is first encoded from a prefix (encode_truncated).
# English runs about 5 characters a token, so the prefix nearly always holds more tokens than are kept.
PREFIX_CHARS_PER_TOKEN = 16
# Where a prefix may be cut: whitespace to BERT under every normalizer option. Not \v, \f, \x85 or \x1c-\x1f:
# the normalizer drops those as control characters, joining the words on either side.
CUT_CHARS = " \t\n\r"
# BERT's CJK ranges: its normalizer puts spaces around each of these characters.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip
# BERT's normalizer drops the ASCII control characters but tab, newline and carriage return (which it reads as
# spaces); str.translate deletes what maps to None.
ASCII_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127])
# Words of an ASCII text the way BERT's pre-tokenizer splits it: runs of letters and digits, and each other
# visible character (all of them are punctuation to BERT) on its own.
ASCII_WORDS = {True: re.compile(r"[a-z0-9]+|[^a-z0-9 \t\n\r]"), False: re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 \t\n\r]")}
# Words whose WordPiece ids are kept for reuse, per tokenizer (natural text has far fewer distinct words).
WORD_CACHE_SIZE = 1 << 18


def encode_truncated(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
    """tokenizer.encode_batch(texts) with the same ids, at a cost bounded by the kept tokens, not the text.

    Truncation keeps only the first max_length tokens, yet the tokenizer would normalize and split the
    whole text (0.7 s a megabyte, 1.6 s one of CJK). BERT's normalizer works character by character and its
    pre-tokenizer ends a word at whitespace and at punctuation (the normalizer spaces out CJK ideographs), so
    a prefix cut right after one of those tokenizes every word before the cut exactly as the whole text does:
    once that prefix alone overflows max_length, its truncated ids are the whole text's. A text with no such
    character in its prefix starts with one word longer than WordPiece reads (max_input_chars_per_word): it
    is [UNK] whatever its length, so a prefix of it stands in for it (_bounded). A text whose prefix does not
    overflow (mostly whitespace, say) is encoded whole in one more call.
    """
    truncation = tokenizer.truncation
    if not (truncation and _prefix_exact(tokenizer, truncation)):
        return tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    words = _Words(
        tokenizer.model.max_input_chars_per_word,
        tuple(token.content.lower() for token in tokenizer.get_added_tokens_decoder().values() if token.content),
        tokenizer.normalizer.normalize_str,
    )
    length = PREFIX_CHARS_PER_TOKEN * truncation["max_length"]
    bounded = [_bounded(text, length, words) for text in texts]
    # One call for the whole batch: the Rust tokenizer spreads it over its threads.
    encodings = tokenizer.encode_batch([shorter for shorter, _ in bounded], add_special_tokens=add_special_tokens)
    redo = [
        i
        for i, ((_, complete), encoding) in enumerate(zip(bounded, encodings, strict=True))
        if not complete and not encoding.overflowing
    ]
    if redo:
        again = tokenizer.encode_batch([texts[i] for i in redo], add_special_tokens=add_special_tokens)
        for i, encoding in zip(redo, again, strict=True):
            encodings[i] = encoding
    return encodings


def _prefix_exact(tokenizer: Tokenizer, truncation: dict) -> bool:
    """Whether the argument of encode_truncated holds for this tokenizer (BERT's, truncating on the right)."""
    return (
        truncation["direction"] == "right"
        and isinstance(tokenizer.normalizer, BertNormalizer)
        and isinstance(tokenizer.pre_tokenizer, BertPreTokenizer)
        and isinstance(tokenizer.model, WordPiece)
        # Added tokens are matched before the pre-tokenizer splits: one spanning whitespace could span a cut.
        and not any(c in token.content for token in tokenizer.get_added_tokens_decoder().values() for c in CUT_CHARS)
    )


@functools.cache
def word_ends() -> tuple[re.Pattern, re.Pattern]:
    """(last_cut, may_split). A cut character always ends a word for BERT's tokenizer, whatever follows it:
    whitespace the normalizer keeps (CUT_CHARS and the Zs spaces), punctuation (ASCII symbols, Unicode P*)
    and CJK ideographs (spaced out). last_cut matches a string up to and including its last cut character.
    may_split finds any character that might end a word (cut characters, other Unicode whitespace, line and
    paragraph separators): a stretch without one is a single word. Built once from unicodedata (~1 s)."""
    categories = [unicodedata.category(chr(code)) for code in range(sys.maxunicode + 1)]
    cut = {code for code, category in enumerate(categories) if category == "Zs" or category[0] == "P"}
    cut |= {ord(char) for char in CUT_CHARS} | {c for c in range(33, 127) if not chr(c).isalnum()}
    cut |= {code for low, high in CJK_RANGES for code in range(low, high + 1)}
    split = cut | {code for code, category in enumerate(categories) if category in ("Zl", "Zp")}
    split |= {code for code in range(sys.maxunicode + 1) if chr(code).isspace()}
    cut, split = sorted(cut), sorted(split)
    return re.compile(f"(?s).*[{_char_class(cut)}]"), re.compile(f"[{_char_class(split)}]")


def _char_class(codes: list[int]) -> str:
    ranges, start = [], codes[0]
    for previous, code in itertools.pairwise([*codes, -1]):
        if code != previous + 1:
            ranges.append(f"\\U{start:08x}" if start == previous else f"\\U{start:08x}-\\U{previous:08x}")
            start = code
    return "".join(ranges)


@dataclass(frozen=True)
class _Words:
    """What cutting a text for the Hugging Face tokenizer needs to know about it (encode_truncated)."""

    max_word_chars: int  # WordPiece reads a longer word as one [UNK]
    added: tuple[str, ...]  # added tokens, lowercased
    normalize: object  # the tokenizer's normalizer's normalize_str

    def spans_added(self, text: str, cut: int) -> bool:
        """Whether an added token (matched before the pre-tokenizer splits) runs across position cut."""
        return any(t in text[max(0, cut - len(t) + 1) : cut + len(t) - 1].lower() for t in self.added)

    def one_unknown_word(self, window: str) -> bool:
        """Whether window, holding no character that may end a word, is a word WordPiece reads as [UNK]
        however it continues (normalized, it is already longer than max_word_chars). Not where an added token
        without a cut character could sit inside the word further on, splitting it."""
        last_cut, _ = word_ends()
        if not all(last_cut.match(token) for token in self.added):
            return False
        return len(self.normalize(window)) > self.max_word_chars and not any(t in window.lower() for t in self.added)


def _bounded(text: str, length: int, words: _Words) -> tuple[str, bool]:
    """(shorter, complete): a text whose ids are the first ids of the whole text, or all of them when
    complete, built from the text's start in pieces until they hold `length` characters' worth of tokens:
    up to the last cut character within the next `length` characters (not inside an added token), or, where
    those characters are one word WordPiece reads as [UNK], a stretch of it (also [UNK]) in its place."""
    last_cut, may_split = word_ends()
    pieces, size, start = [], 0, 0
    while size < length:
        if len(text) - start <= length:
            pieces.append(text[start:])
            return "".join(pieces), True
        end = start + length
        for _ in range(4):  # an added token across a cut: try the cut before it
            match = last_cut.match(text, start, end)
            if match is None or not words.spans_added(text, match.end()):
                break
            end = match.end() - 1
        else:
            return text, True
        if match is not None:
            pieces.append(text[start : match.end()])
            size, start = size + match.end() - start, match.end()
            continue
        window = text[start : start + length]
        if may_split.search(window) or not words.one_unknown_word(window):
            return text, True
        short = window[: 2 * (words.max_word_chars + 1)]  # enough for [UNK] unless normalizing drops characters
        pieces.append(short if words.one_unknown_word(short) else window)
        size += PREFIX_CHARS_PER_TOKEN  # one token
        after = may_split.search(text, start + length)
        if after is None:
            return "".join(pieces), True
        if not last_cut.match(text, after.start(), after.end()):
            return text, True  # a character that may or may not end the word: take no chance
        start = after.start()
    return "".join(pieces), False


def _first_tokens(text: str, encoding: Encoding, tokens: int) -> str:
    """The text up to the end of its `tokens`-th token, or all of it if it has no more."""
    return text[: encoding.offsets[tokens - 1][1]] if len(encoding.ids) > tokens else text


def longest_first(first: int, second: int, room: int) -> tuple[int, int]:
    """How many tokens of each side of a pair the Hugging Face tokenizer keeps when truncating longest first
    to `room` (max_length less the special tokens): the shorter side whole if the longer still gets at least
    as much, else the room split in halves, the second side taking the odd one."""
    if first + second <= room:
        return first, second
    short, long = sorted((first, second))
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short = room // 2
        long = short + room % 2
    return (long, short) if first > second else (short, long)


@dataclass(frozen=True)
class _AsciiPath:
    """BERT's tokenizer, as the ASCII path applies it."""

    lowercase: bool
    words: re.Pattern
    first: int  # [CLS]
    last: int  # [SEP]
    unk: tuple[int]
    max_word_chars: int  # a longer word is one [UNK], as WordPiece has it
    model: WordPiece
    added: tuple[str, ...]  # added tokens, lowercased: matched in the raw text before normalization
    pairs: bool  # the tokenizer joins a pair as [CLS] a [SEP] b [SEP], types 0 to the first [SEP], then 1, and
    # truncates it longest first: the pair path applies that too


class TextTokenizer:
    """Texts -> packed token ids, truncated to max_tokens: the stages' tokenizer.

    ASCII texts (most English) take a path of their own that gives the same ids at a fraction of the cost: for
    ASCII, BERT's normalizer and pre-tokenizer reduce to deleting control characters, lowercasing and one
    regular expression, and each word's WordPiece ids are the tokenizer model's own, kept in a bounded cache.
    The Rust tokenizer spends most of its time tracking character offsets, which serving never reads (about
    130 us for a 190-character text against 15 us here, one core). A long text is read from a prefix first, as
    in encode_truncated. Every other text (non-ASCII, or holding an added token such as [MASK]) and every
    tokenizer that is not BERT's WordPiece goes to the Hugging Face tokenizer (encode_truncated).
    """

    def __init__(self, tokenizer: Tokenizer, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._words: dict[str, tuple[int, ...]] = {}
        self._ascii = self._ascii_path()
        self._side: Tokenizer | None = None  # pairs: one side truncated (encode_pairs_slow)
        self._whole = Tokenizer.from_str(tokenizer.to_str())  # pairs: whole lengths, where they decide
        self._whole.no_truncation()

    @classmethod
    def from_file(cls, path: str | Path, max_tokens: int) -> TextTokenizer:
        return cls(load_tokenizer(path, max_tokens), max_tokens)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, lengths): every text's ids one after the other (int32), and how many each text has (int64)."""
        rows: list = [None] * len(texts)
        others = []
        for index, text in enumerate(texts):
            row = self._encode_ascii(text) if self._ascii and text.isascii() else None
            if row is None:
                others.append(index)
            else:
                rows[index] = row
        if others:
            for index, encoding in zip(others, self.encode_slow([texts[i] for i in others]), strict=True):
                rows[index] = encoding.ids
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        ids = np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
        return ids, lengths

    def encode_slow(self, texts: list[str]) -> list[Encoding]:
        """The Hugging Face tokenizer's encodings (the reference the ASCII path is held to)."""
        return encode_truncated(self.tokenizer, texts)

    def _ascii_path(self) -> _AsciiPath | None:
        """What the ASCII path needs, or None where its argument does not hold for this tokenizer."""
        tok, truncation = self.tokenizer, self.tokenizer.truncation
        normalizer, model = tok.normalizer, tok.model
        if not (
            truncation
            and truncation["direction"] == "right"
            and truncation["max_length"] == self.max_tokens
            and isinstance(normalizer, BertNormalizer)
            and normalizer.clean_text
            and isinstance(tok.pre_tokenizer, BertPreTokenizer)
            and isinstance(model, WordPiece)
        ):
            return None
        unk = tok.token_to_id(model.unk_token)
        # The post-processor's special tokens around the text, read off the tokenizer itself: [CLS] ... [SEP].
        empty = tok.encode("").ids
        probe = "a b"
        inner = [token.id for word in probe.split() for token in model.tokenize(word)]
        if unk is None or len(empty) != 2 or tok.encode(probe).ids != [empty[0], *inner, empty[1]]:
            return None
        added = [token.content for token in tok.get_added_tokens_decoder().values() if token.content]
        if any(char in content for content in added for char in CUT_CHARS):
            return None
        lowercase = bool(normalizer.lowercase)
        pair = tok.encode("a", "b")
        a, b = (model.tokenize(word)[0].id for word in "ab")
        pairs = (
            truncation["strategy"] == "longest_first"
            and pair.ids == [empty[0], a, empty[1], b, empty[1]]
            and pair.type_ids == [0, 0, 0, 1, 1]
        )
        return _AsciiPath(
            lowercase, ASCII_WORDS[lowercase], empty[0], empty[1], (unk,), model.max_input_chars_per_word, model,
            tuple(content.lower() for content in added), pairs,
        )  # fmt: skip

    def _encode_ascii(self, text: str) -> list[int] | None:
        """The ids of an ASCII text, or None if it holds an added token. A long text is first read up to its
        last whitespace within PREFIX_CHARS_PER_TOKEN * max_tokens characters, as in encode_truncated: the
        words before that whitespace are whole (added tokens hold no whitespace, or this path is off)."""
        window = PREFIX_CHARS_PER_TOKEN * self.max_tokens
        if len(text) > window:
            cut = max(text.rfind(char, 0, window) for char in CUT_CHARS)
            if cut > 0:
                ids = self._ascii_ids(text[:cut])
                if ids is None or len(ids) == self.max_tokens:
                    return ids
        return self._ascii_ids(text)

    def _ascii_ids(self, text: str) -> list[int] | None:
        path = self._ascii
        inner = self._inner_ids(text, self.max_tokens - 2)  # [CLS] and [SEP] around them
        return None if inner is None else [path.first, *inner, path.last]

    def _inner_ids(self, text: str, limit: int) -> list[int] | None:
        """The first `limit` WordPiece ids of an ASCII text, no special tokens; None if it holds an added token."""
        path = self._ascii
        text = text.translate(ASCII_CONTROL)
        if path.lowercase:
            text = text.lower()
        if any(token in text for token in path.added):
            return None
        ids: list[int] = []
        for word in path.words.finditer(text):  # lazily: a text without whitespace stops at the limit too
            word = word.group()
            pieces = self._words.get(word)
            ids += self._word_pieces(word) if pieces is None else pieces
            if len(ids) >= limit:
                del ids[limit:]
                break
        return ids

    def encode_pairs(self, queries: list[str], texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, lengths, types) of (query, text) pairs, packed as encode's, each pair `[CLS] query [SEP] text
        [SEP]` with token types 0 up to the first [SEP] and 1 after it, truncated to max_tokens longest first:
        the Hugging Face tokenizer's ids and types for tokenizer(query, text)."""
        rows: list = [None] * len(texts)
        others = []
        for index, pair in enumerate(zip(queries, texts, strict=True)):
            row = self._encode_pair_ascii(*pair) if self._ascii and self._ascii.pairs else None
            if row is None:
                others.append(index)
            else:
                rows[index] = row
        if others:
            encodings = self.encode_pairs_slow([queries[i] for i in others], [texts[i] for i in others])
            for index, encoding in zip(others, encodings, strict=True):
                rows[index] = (encoding.ids, encoding.type_ids)
        lengths = np.fromiter((len(ids) for ids, _ in rows), dtype=np.int64, count=len(rows))
        total = int(lengths.sum())
        ids = np.fromiter(chain.from_iterable(ids for ids, _ in rows), dtype=np.int32, count=total)
        types = np.fromiter(chain.from_iterable(types for _, types in rows), dtype=np.int32, count=total)
        return ids, lengths, types

    def encode_pairs_slow(self, queries: list[str], texts: list[str]) -> list[Encoding]:
        """The Hugging Face tokenizer's encodings of (query, text) pairs, each side first cut to a few tokens more
        than the pair can keep. Whole, a long pair is costly beyond its length: the tokenizer's longest-first
        truncation also makes every combination of the two sides' overflowing windows (two texts of 10,000
        tokens, 128 kept: a million encodings). A side is cut at the end of its (room + 1)-th token, which
        keeps the truncation's choice; where both sides are longer than the room, the longer keeps one token
        more, as only their whole lengths tell which keeps the odd token."""
        room = self.max_tokens - self.tokenizer.num_special_tokens_to_add(True)
        side = self._side_tokenizer(room + 2)
        cut = [encode_truncated(side, sides, add_special_tokens=False) for sides in (queries, texts)]
        shorter_queries, shorter_texts = [], []
        for query, text, first, second in zip(queries, texts, *cut, strict=True):
            keep_first = keep_second = room + 1
            if len(first.ids) > room and len(second.ids) > room:
                whole_first, whole_second = (len(e.ids) for e in self._whole.encode_batch([query, text], False))
                keep_first += whole_first > whole_second
                keep_second += whole_second > whole_first
            shorter_queries.append(_first_tokens(query, first, keep_first))
            shorter_texts.append(_first_tokens(text, second, keep_second))
        return self.tokenizer.encode_batch(list(zip(shorter_queries, shorter_texts, strict=True)))

    def _side_tokenizer(self, length: int) -> Tokenizer:
        """The tokenizer truncating one text to `length` tokens, special tokens left out by the caller."""
        if self._side is None or self._side.truncation["max_length"] != length:
            self._side = Tokenizer.from_str(self.tokenizer.to_str())
            self._side.no_padding()
            self._side.enable_truncation(max_length=length)
        return self._side

    def _encode_pair_ascii(self, query: str, text: str) -> tuple[list[int], list[int]] | None:
        if not (query.isascii() and text.isascii()):
            return None
        room = self.max_tokens - 3  # [CLS], [SEP], [SEP]
        first, second = self._inner_prefix_ids(query, room + 1), self._inner_prefix_ids(text, room + 1)
        if first is None or second is None:
            return None
        if len(first) > room and len(second) > room and room % 2:
            return None  # which one is longer decides who keeps the odd token: only the whole texts can say
        keep_first, keep_second = longest_first(len(first), len(second), room)
        path = self._ascii
        ids = [path.first, *first[:keep_first], path.last, *second[:keep_second], path.last]
        return ids, [0] * (keep_first + 2) + [1] * (keep_second + 1)

    def _inner_prefix_ids(self, text: str, limit: int) -> list[int] | None:
        """_inner_ids, a long text first read up to its last whitespace within PREFIX_CHARS_PER_TOKEN * limit
        characters (the words before that whitespace are whole, as in _encode_ascii)."""
        window = PREFIX_CHARS_PER_TOKEN * limit
        if len(text) > window:
            cut = max(text.rfind(char, 0, window) for char in CUT_CHARS)
            if cut > 0:
                ids = self._inner_ids(text[:cut], limit)
                if ids is None or len(ids) == limit:
                    return ids
        return self._inner_ids(text, limit)

    def _word_pieces(self, word: str) -> tuple[int, ...]:
        path = self._ascii
        if len(word) > path.max_word_chars:
            return path.unk
        pieces = tuple(token.id for token in path.model.tokenize(word))
        if len(self._words) < WORD_CACHE_SIZE:
            self._words[word] = pieces
        return pieces
