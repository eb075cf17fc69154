"""The Hugging Face tokenizer's ids for texts of any size, at a cost bounded by the kept tokens (encode_truncated).

Truncation keeps only the first max_length tokens, yet the tokenizer would normalize and split the whole text
(0.7 s a megabyte, 1.6 s one of CJK). Where a text cut at the right place provably tokenizes to the whole
text's first ids, a prefix of PREFIX_CHARS_PER_TOKEN characters a kept token is encoded instead: once that
prefix alone overflows max_length, its truncated ids are the whole text's. A text whose prefix does not
overflow (mostly whitespace, say) is encoded whole in one more call. Two arguments say where to cut:

- BERT's tokenizer: after whitespace or punctuation (bert_prefix.py).
- Tokenizers of the components below (RoBERTa's and ModernBERT's byte-level BPE, XLM-R's and CamemBERT's
  Unigram, and others): right before a space (U+0020) that follows a character that is not whitespace. The
  normalizers normalize the text before such a cut as the start of the whole text: Unicode normalization
  splits before any U+0020 (a starter nothing composes with), lowercasing goes character by character, and
  none maps a character that is not whitespace to nothing or to a string ending in whitespace (over all of
  Unicode: tests/model/test_tokenizer_layouts.py), so the normalized prefix still ends in one, the rest still
  starts with a space, and no run of spaces crosses the cut (Replace " {2,}"). Every pre-tokenizer ends a word
  there: Metaspace and WhitespaceSplit split at a space, and ByteLevel's GPT-2 expression never takes
  whitespace after a non-whitespace character into that character's word (its letter, number and symbol
  classes exclude whitespace, its contractions are fixed strings). The models read each word alone. An added
  token (matched before all that) straddles the cut only if it holds a non-whitespace character followed by a
  space: with such a token, there is no cut.

Any other component gets no cut (its texts are encoded whole), and TextTokenizer.path says why.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable

from tokenizers import Encoding, Tokenizer
from tokenizers.models import BPE, Unigram, WordLevel, WordPiece

from .bert_prefix import CUT_CHARS, BertWords, bert_bounded, is_bert, word_ends

# A text longer than this many characters per kept token is first encoded from a prefix. English runs about 5
# characters a token, so the prefix nearly always holds more tokens than are kept.
PREFIX_CHARS_PER_TOKEN = 16
SPACE_CUT_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
RUNS_OF_SPACES = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
SPACE_CUT_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "WhitespaceSplit"})
# The last cut before a space within a window (match the window; .end() is the cut), and the first one after.
LAST_SPACE_CUT = re.compile(r"(?s).*\S(?= )")
SPACE_CUT = re.compile(r"\S(?= )")
STRADDLES_CUT = re.compile(r"\S ")
# (text, length, token_chars) -> (shorter, complete): see bert_bounded.
Cut = Callable[[str, int, int], tuple[str, bool]]


def state(component) -> dict | None:
    """A tokenizer component's configuration, as tokenizer.json holds it."""
    return None if component is None else json.loads(component.__getstate__())


def members(config: dict | None, key: str) -> list[dict]:
    """The components of a configuration, Sequences flattened (key: "normalizers" or "pretokenizers")."""
    if config is None:
        return []
    if config["type"] == "Sequence":
        return [member for part in config[key] for member in members(part, key)]
    return [config]


def space_bounded(text: str, length: int, token_chars: int) -> tuple[str, bool]:
    """(shorter, complete), as bert_bounded: the text up to its last cut before a space within `length`
    characters, else up to its first one after; whole (complete) without one, as a word cannot be cut (no
    stretch of it stands in for it, so token_chars goes unused)."""
    if len(text) <= length:
        return text, True
    match = LAST_SPACE_CUT.match(text, 0, length + 1) or SPACE_CUT.search(text, length)
    return (text, True) if match is None else (text[: match.end()], False)


def _space_cut_refusal(tokenizer: Tokenizer) -> str | None:
    """Why the cut before a space is not known to be exact for this tokenizer, or None where it is."""
    for part in members(state(tokenizer.normalizer), "normalizers"):
        if part["type"] == "Precompiled":
            return "normalizer Precompiled: SentencePiece's character map may map any character to whitespace"
        if part["type"] not in SPACE_CUT_NORMALIZERS and part != RUNS_OF_SPACES:
            return f"normalizer {part['type']}"
    splitters = members(state(tokenizer.pre_tokenizer), "pretokenizers")
    if not splitters:
        return "no pre-tokenizer: a text is one word"
    for part in splitters:
        if part["type"] not in SPACE_CUT_PRE_TOKENIZERS:
            return f"pre-tokenizer {part['type']}"
        if not part.get("use_regex", True) or not part.get("split", True):  # ByteLevel's, Metaspace's
            return f"pre-tokenizer {part['type']} making a text one word"
    model = tokenizer.model
    if not isinstance(model, (BPE, Unigram, WordPiece, WordLevel)) or (isinstance(model, BPE) and model.dropout):
        return f"model {type(model).__name__}"
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer else str
    for token in tokenizer.get_added_tokens_decoder().values():
        if STRADDLES_CUT.search(token.content) or (token.normalized and STRADDLES_CUT.search(normalize(token.content))):
            return f"added token {token.content!r} holds a space after a word"
    return None


def prefix_cut(tokenizer: Tokenizer) -> tuple[Cut | None, str]:
    """The cut that reads this tokenizer's long texts from a prefix (None where no argument covers it), and
    how long texts are encoded, in words for the stage's log."""
    truncation = tokenizer.truncation
    if truncation and truncation["direction"] != "right":
        return None, "long texts encoded whole (truncation from the left)"
    if is_bert(tokenizer):
        if any(char in token.content for token in tokenizer.get_added_tokens_decoder().values() for char in CUT_CHARS):
            return None, "long texts encoded whole (an added token holds whitespace)"
        word_ends()  # built now rather than on the first long non-ASCII text
        return functools.partial(bert_bounded, words=BertWords.of(tokenizer)), "long texts read from a prefix"
    refusal = _space_cut_refusal(tokenizer)
    if refusal:
        return None, f"long texts encoded whole ({refusal})"
    return space_bounded, "long texts read from a prefix"


class PrefixEncoder:
    """tokenizer.encode_batch(texts) with the same ids, long texts read from a prefix where prefix_cut has a cut
    for the tokenizer (which truncates on the right)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cut, self.described = prefix_cut(tokenizer)

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        truncation = self.tokenizer.truncation
        if self.cut is None or not truncation:
            return self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        length = PREFIX_CHARS_PER_TOKEN * truncation["max_length"]
        bounded = [self.cut(text, length, PREFIX_CHARS_PER_TOKEN) for text in texts]
        # One call for the whole batch: the Rust tokenizer spreads it over its threads.
        encodings = self.tokenizer.encode_batch(
            [shorter for shorter, _ in bounded], add_special_tokens=add_special_tokens
        )
        redo = [
            i
            for i, ((_, complete), encoding) in enumerate(zip(bounded, encodings, strict=True))
            if not complete and not encoding.overflowing
        ]
        if redo:
            again = self.tokenizer.encode_batch([texts[i] for i in redo], add_special_tokens=add_special_tokens)
            for i, encoding in zip(redo, again, strict=True):
                encodings[i] = encoding
        return encodings


def encode_truncated(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
    """tokenizer.encode_batch(texts) with the same ids, at a cost bounded by the kept tokens where a prefix cut
    is exact for the tokenizer (PrefixEncoder, which a caller encoding often keeps)."""
    return PrefixEncoder(tokenizer).encode(texts, add_special_tokens)
