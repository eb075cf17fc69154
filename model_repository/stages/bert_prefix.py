"""Where a text may be cut for BERT's tokenizer (BertNormalizer, BertPreTokenizer, WordPiece) so that the prefix
tokenizes to the whole text's first ids: prefix_encoding.py reads long texts from such a prefix.

BERT's normalizer works character by character and its pre-tokenizer ends a word at whitespace and at
punctuation (the normalizer spaces out CJK ideographs), so a prefix cut right after one of those tokenizes every
word before the cut exactly as the whole text does. A text with no such character in its prefix starts with one
word longer than WordPiece reads (max_input_chars_per_word): it is [UNK] whatever its length, so a stretch of it
stands in for it.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import unicodedata
from dataclasses import dataclass

from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

# Whitespace to BERT under every normalizer option. Not \v, \f, \x85 or \x1c-\x1f: the normalizer drops those as
# control characters, joining the words on either side.
CUT_CHARS = " \t\n\r"
# BERT's CJK ranges: its normalizer puts spaces around each of these characters.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


def is_bert(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer is BERT's: its normalizer, pre-tokenizer and model."""
    return (
        isinstance(tokenizer.normalizer, BertNormalizer)
        and isinstance(tokenizer.pre_tokenizer, BertPreTokenizer)
        and isinstance(tokenizer.model, WordPiece)
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
class BertWords:
    """What cutting a text for BERT's tokenizer needs to know about it."""

    max_word_chars: int  # WordPiece reads a longer word as one [UNK]
    added: tuple[str, ...]  # added tokens, lowercased
    normalize: object  # the tokenizer's normalizer's normalize_str

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> BertWords:
        added = tokenizer.get_added_tokens_decoder().values()
        contents = tuple(token.content.lower() for token in added if token.content)
        return cls(tokenizer.model.max_input_chars_per_word, contents, tokenizer.normalizer.normalize_str)

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


def bert_bounded(text: str, length: int, token_chars: int, words: BertWords) -> tuple[str, bool]:
    """(shorter, complete): a text whose ids are the first ids of the whole text, or all of them when
    complete, built from the text's start in pieces until they hold `length` characters' worth of tokens
    (token_chars a token): up to the last cut character within the next `length` characters (not inside an
    added token), or, where those characters are one word WordPiece reads as [UNK], a stretch of it (also
    [UNK]) in its place."""
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
        size += token_chars  # one token
        after = may_split.search(text, start + length)
        if after is None:
            return "".join(pieces), True
        if not last_cut.match(text, after.start(), after.end()):
            return text, True  # a character that may or may not end the word: take no chance
        start = after.start()
    return "".join(pieces), False
