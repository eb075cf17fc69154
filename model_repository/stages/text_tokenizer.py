"""Texts -> token ids. `TextTokenizer` is what the stages call: a batch of texts in, the token ids of every
text packed into one int32 array plus each text's length out, truncated to max_tokens, identical to the Hugging
Face fast tokenizer's ids, for every tokenizer the encoder families ship: BERT's and MPNet's WordPiece,
RoBERTa's and ModernBERT's byte-level BPE, XLM-R's and CamemBERT's Unigram (tests/model/test_tokenizer_layouts.py
and test_tokenization.py hold the two to that on generated texts and on the corpus).

Its parts: the ASCII fast path (ascii_path.py, with the special tokens around texts and pairs of
special_tokens.py), and the Hugging Face tokenizer reading long texts from a prefix (prefix_encoding.py,
bert_prefix.py).
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from common.hf_tokenizer import load_tokenizer

from .ascii_path import ascii_path
from .prefix_encoding import PrefixEncoder
from .special_tokens import longest_first


class TextTokenizer:
    """Texts (or (query, text) pairs) -> packed token ids, truncated to max_tokens: the stages' tokenizer.

    ASCII texts (most English) take a path of their own where the tokenizer has one (ascii_path.py): the same
    ids at a fraction of the cost (17-40 us for a 190-character text against 67-154 us in the Rust tokenizer,
    one core, every family: docs/results/cpu-2026-12-03/tokenizers/). Every other text (non-ASCII, or holding
    an added token such as [MASK]) goes to the Hugging Face tokenizer, a long one read from a prefix where that
    is exact for the tokenizer (prefix_encoding.py). `path` says which are used, for the stage's log.
    """

    def __init__(self, tokenizer: Tokenizer, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._prefix = PrefixEncoder(tokenizer)
        self._ascii, no_ascii = ascii_path(tokenizer, max_tokens, self._prefix.cut)
        model = type(tokenizer.model).__name__
        if self._ascii:
            self.path = f"ASCII fast path ({self._ascii.kind}), Hugging Face tokenizer ({model}) for the rest"
        else:
            self.path = f"Hugging Face tokenizer ({model}; no ASCII fast path: {no_ascii})"
        self.path += f"; {self._prefix.described}"
        self._side: PrefixEncoder | None = None  # pairs: one side truncated (encode_pairs_slow)
        self._whole: Tokenizer | None = None  # pairs: whole lengths, where they decide

    @classmethod
    def from_file(cls, path: str | Path, max_tokens: int) -> TextTokenizer:
        return cls(load_tokenizer(path, max_tokens), max_tokens)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, lengths): every text's ids one after the other (int32), and how many each text has (int64)."""
        rows: list = [None] * len(texts)
        others = []
        fast = self._ascii
        for index, text in enumerate(texts):
            row = fast.encode(text) if fast and text.isascii() else None
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
        return self._prefix.encode(texts)

    def encode_pairs(self, queries: list[str], texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, lengths, types) of (query, text) pairs, packed as encode's, each pair laid out by the tokenizer's
        post-processor (`[CLS] query [SEP] text [SEP]`, types 0 then 1, for BERT; `<s> query </s></s> text </s>`
        for RoBERTa) and truncated to max_tokens longest first: the Hugging Face tokenizer's ids and types for
        tokenizer(query, text)."""
        rows: list = [None] * len(texts)
        others = []
        fast = self._ascii if self._ascii and self._ascii.pairs else None
        for index, (query, text) in enumerate(zip(queries, texts, strict=True)):
            row = fast.encode_pair(query, text) if fast and query.isascii() and text.isascii() else None
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
        """The Hugging Face tokenizer's encodings of (query, text) pairs, each side encoded alone (a long one
        from a prefix) to one token more than the pair can keep, cut to what longest-first truncation keeps of
        it and joined by the tokenizer's post-processor: what the tokenizer does with a pair, less its cost.
        Whole, a long pair is costly beyond its length: the tokenizer's truncation also makes every combination
        of the two sides' overflowing windows (two texts of 10,000 tokens, 128 kept: a million encodings)."""
        room = self.max_tokens - self.tokenizer.num_special_tokens_to_add(True)
        side = self._side_encoder(room + 1)
        encodings = []
        for query, text, first, second in zip(
            queries, texts, side.encode(queries, False), side.encode(texts, False), strict=True
        ):
            length_first, length_second = len(first.ids), len(second.ids)
            if length_first > room and length_second > room and room % 2:
                # Both sides are long: the longer keeps the odd token, which only the whole texts can say.
                whole_first, whole_second = (
                    len(e.ids) for e in self._whole_tokenizer().encode_batch([query, text], add_special_tokens=False)
                )
                length_first += whole_first > whole_second
                length_second += whole_second > whole_first
            keep_first, keep_second = longest_first(length_first, length_second, room)
            first.truncate(keep_first)
            second.truncate(keep_second)
            encodings.append(self.tokenizer.post_process(first, second))
        return encodings

    def _side_encoder(self, length: int) -> PrefixEncoder:
        """The tokenizer truncating one text to `length` tokens, special tokens left out by the caller."""
        if self._side is None:
            side = Tokenizer.from_str(self.tokenizer.to_str())
            side.no_padding()
            side.enable_truncation(max_length=length)
            self._side = PrefixEncoder(side)
        return self._side

    def _whole_tokenizer(self) -> Tokenizer:
        if self._whole is None:
            self._whole = Tokenizer.from_str(self.tokenizer.to_str())
            self._whole.no_truncation()
        return self._whole
