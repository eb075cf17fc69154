"""The Hugging Face tokenizer's ids for texts of any size, at a cost bounded by the kept tokens (PrefixEncoder).

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

SentencePiece's character map (the Precompiled normalizer of real XLM-R and CamemBERT checkpoints), first among
the normalizers, keeps that up at fewer cuts. The Rust normalizer (tokenizers' precompiled.rs, spm_precompiled)
splits the text into extended grapheme clusters (UAX #29) and maps each on its own: a cluster under 6 bytes that
starts with a key of the map becomes the replacement of the shortest such key, the rest of the cluster dropped
("\r\n" and "\xa0\u0301" both become " " under nmt_nfkc); any other cluster is mapped character by character
(a key's replacement, else the character). At load (charsmap_cut) the keys are read off the map's trie, those
mapped to nothing or to a string ending in whitespace among them (nmt_nfkc's: control characters, the spaces,
U+200B-U+200F, U+2581, U+FEFF, U+FFFD), and a cut then also needs:
- a cut character that is not Prepend (PREPEND; the tests check every character against the Rust tokenizer):
  UAX #29 breaks before a space after any other, so the prefix's clusters are the whole text's up to the cut;
- no key starting with a space (else no cut): the cluster at the cut, the space and any marks after it, maps to
  a string starting with that space;
- neither the cut character nor any of the 4 before it the first character of such a key (control characters
  before it aside: each is a cluster of its own, UAX #29 GB4): the prefix's last cluster then maps to a string
  ending in a character that is not whitespace, the cut character or its replacement (character by character),
  or the replacement of the shortest key the cluster starts with (under 6 bytes, it starts at most 4 before).
So the map of the prefix is the start of the whole text's, ends in a character that is not whitespace, and the
rest starts with a space: the argument above goes on from there.

Any other component gets no cut (its texts are encoded whole), and TextTokenizer.path says why."""

from __future__ import annotations

import base64
import functools
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.models import BPE, Unigram, WordLevel, WordPiece

from .bert_prefix import CUT_CHARS, BertWords, bert_bounded, is_bert, word_ends

# A text longer than this many characters per kept token is first encoded from a prefix. English runs about 5
# characters a token, so the prefix nearly always holds more tokens than are kept.
PREFIX_CHARS_PER_TOKEN = 16
SPACE_CUT_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
RUNS_OF_SPACES = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
SPACE_CUT_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "WhitespaceSplit"})
STRADDLES_CUT = re.compile(r"\S ")
# UAX #29's Prepend characters (GB9b: no cluster break after one), as a regular expression class: those of the
# Rust tokenizer's unicode-segmentation (Unicode 16), and U+11A3A, which earlier versions held Prepend.
PREPEND = (
    r"\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u0d4e\U000110bd\U000110cd\U000111c2\U000111c3\U000113d1"
    r"\U0001193f\U00011941\U00011a3a\U00011a84-\U00011a89\U00011d46\U00011f02"
)
# A cluster of this many bytes or more is mapped character by character (spm_precompiled's Precompiled).
WHOLE_CLUSTER_BYTES = 6
# What str.isspace takes for whitespace (Unicode's White_Space and \x1c-\x1f), the last of it U+3000.
WHITESPACE = "".join(chr(code) for code in range(0x3000 + 1) if chr(code).isspace())
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


class SpaceCut:
    """Cuts right before a space (U+0020) that follows a character that is neither whitespace nor one of
    `avoid`, none of the 4 characters before it one of `avoid_before` (both regular expression classes)."""

    def __init__(self, avoid: str = "", avoid_before: str = "") -> None:
        before = "".join(rf"(?<![{avoid_before}]{'.' * n})" for n in range(1, WHOLE_CLUSTER_BYTES - 1))
        end = rf"[^\s{avoid}]{before if avoid_before else ''}(?= )"
        self._last = re.compile(rf"(?s).*{end}")  # match a window: .end() is its last cut
        self._first = re.compile(rf"(?s){end}")  # search from a position: .end() is the first cut after it

    def last_cut(self, text: str, window: int) -> int:
        """The last cut within the text's first `window` characters, or -1."""
        match = self._last.match(text, 0, window + 1)
        return -1 if match is None else match.end()

    def __call__(self, text: str, length: int, token_chars: int) -> tuple[str, bool]:
        """(shorter, complete), as bert_bounded: the text up to its last cut within `length` characters, else up
        to its first one after; whole (complete) without one, as a word cannot be cut (no stretch of it stands
        in for it, so token_chars goes unused)."""
        if len(text) <= length:
            return text, True
        match = self._last.match(text, 0, length + 1) or self._first.search(text, length)
        return (text, True) if match is None else (text[: match.end()], False)


SPACE_CUT = SpaceCut()


@dataclass(frozen=True)
class CharsMap:
    """SentencePiece's character map as spm_precompiled reads it: a little-endian u32 (the trie's size in
    bytes), the trie's u32 units, then the replacements, each ended by a NUL. A unit's children lie at its base
    (its position XOR its offset) XOR their label byte; the key to a unit with its leaf bit set maps to the
    replacement at the offset held by the unit at its base. The trie is a DAWG (keys share their ends): nodes
    are known by their base, and walked as such rather than key by key."""

    units: np.ndarray
    bases: np.ndarray
    labels: np.ndarray
    edges: np.ndarray  # every unit a child of a node reached from the root, by its node's base
    parents: np.ndarray  # the base of each one's node (sorted)
    replacements: np.ndarray

    @classmethod
    def of(cls, charsmap: bytes) -> CharsMap:
        size = int.from_bytes(charsmap[:4], "little")
        units = np.frombuffer(charsmap, dtype="<u4", count=size // 4, offset=4).astype(np.int64)
        bases = np.arange(len(units)) ^ ((units >> 10) << ((units & (1 << 9)) >> 6))
        labels = units & ((1 << 31) | 0xFF)  # a replacement's unit has bit 31 set: no label
        labelled = np.flatnonzero((labels > 0) & (labels < 256))
        parents = labelled ^ labels[labelled]  # the base of the node each would be a child of
        reached, nodes = np.zeros(0, dtype=np.int64), bases[:1]
        while len(nodes):  # breadth first from the root: the children of the nodes reached
            reached = np.union1d(reached, nodes)
            nodes = np.setdiff1d(bases[labelled[np.isin(parents, nodes)]], reached)
        edges = labelled[np.isin(parents, reached)]
        edges = edges[np.argsort(edges ^ labels[edges], kind="stable")]
        replacements = np.frombuffer(charsmap, dtype=np.uint8, offset=4 + size)
        return cls(units, bases, labels, edges, edges ^ labels[edges], replacements)

    def children(self, node: int) -> np.ndarray:
        return self.edges[np.searchsorted(self.parents, node) : np.searchsorted(self.parents, node, "right")]

    def first_chars(self) -> dict[str, int] | None:
        """The first character of every key, and the unit it leads to; None if a key ends inside a character."""
        firsts, walk = {}, [(int(self.bases[0]), b"")]
        while walk:
            node, head = walk.pop()
            for unit in self.children(node).tolist():
                key = head + bytes([self.labels[unit]])
                try:
                    firsts[key.decode()] = unit
                except UnicodeDecodeError:  # the first bytes of a character (of none past 4: no text holds it)
                    if (self.units[unit] >> 8) & 1:
                        return None
                    if len(key) < 4:
                        walk.append((int(self.bases[unit]), key))
        return firsts

    def spaced(self) -> np.ndarray:
        """For each of edges: whether a key ending at it, or going on past it, maps to nothing or to a string
        ending in whitespace."""
        ends = np.append(np.flatnonzero(self.replacements == 0), len(self.replacements))  # a last one read to the end
        spaced_end = np.zeros(len(ends), dtype=bool)  # whether the replacement ended there ends in whitespace
        for char in WHITESPACE:
            encoded = np.frombuffer(char.encode(), dtype=np.uint8)
            starts = ends - len(encoded)
            fits = starts >= 0
            spaced_end[fits] |= np.all(self.replacements[starts[fits, None] + np.arange(len(encoded))] == encoded, 1)
        leaf = (self.units[self.edges] >> 8) & 1 == 1
        offsets = self.units[self.bases[self.edges[leaf]]] & ((1 << 31) - 1)
        end = np.searchsorted(ends, offsets)
        spaced = np.zeros(len(self.edges), dtype=bool)
        spaced[leaf] = (ends[end] == offsets) | spaced_end[end]
        nodes = np.unique(self.parents)  # a node whose key goes on past an edge is its base's
        below = np.searchsorted(nodes, self.bases[self.edges])
        has_node = below < len(nodes)
        has_node[has_node] = nodes[below[has_node]] == self.bases[self.edges[has_node]]
        while True:  # up from the keys' ends, a level each round
            node_spaced = np.zeros(len(nodes), dtype=bool)
            node_spaced[np.searchsorted(nodes, self.parents[spaced])] = True
            grown = spaced.copy()
            grown[has_node] |= node_spaced[below[has_node]]
            if (grown == spaced).all():
                return spaced
            spaced = grown


def charsmap_cut(charsmap: bytes) -> tuple[SpaceCut | None, str]:
    """The cut before a space for a tokenizer whose first normalizer is SentencePiece's character map (see the
    module's docstring), or None and why there is none."""
    trie = CharsMap.of(charsmap)
    firsts = trie.first_chars()
    if firsts is None:
        return None, "normalizer Precompiled: a key of its character map ends inside a character"
    if " " in firsts:
        return None, "normalizer Precompiled: a key of its character map starts with a space"
    spaced = dict(zip(trie.edges.tolist(), trie.spaced().tolist(), strict=True))
    starts = sorted(char for char, unit in firsts.items() if spaced[unit])
    avoid = "".join(f"\\U{ord(char):08x}" for char in starts)
    # A control character is a cluster of its own (UAX #29 GB4): only as the cut character does it matter.
    before = "".join(f"\\U{ord(char):08x}" for char in starts if unicodedata.category(char) != "Cc")
    return SpaceCut(avoid + PREPEND, before), ""


def _space_cut(tokenizer: Tokenizer) -> tuple[SpaceCut | None, str]:
    """The cut before a space for this tokenizer, or None and why it is not known to be exact."""
    cut = SPACE_CUT
    for index, part in enumerate(members(state(tokenizer.normalizer), "normalizers")):
        if part["type"] == "Precompiled":
            if index:
                return None, "normalizer Precompiled after another one"
            cut, refusal = charsmap_cut(base64.b64decode(part["precompiled_charsmap"]))
            if cut is None:
                return None, refusal
        elif part["type"] not in SPACE_CUT_NORMALIZERS and part != RUNS_OF_SPACES:
            return None, f"normalizer {part['type']}"
    splitters = members(state(tokenizer.pre_tokenizer), "pretokenizers")
    if not splitters:
        return None, "no pre-tokenizer: a text is one word"
    for part in splitters:
        if part["type"] not in SPACE_CUT_PRE_TOKENIZERS:
            return None, f"pre-tokenizer {part['type']}"
        if not part.get("use_regex", True) or not part.get("split", True):  # ByteLevel's, Metaspace's
            return None, f"pre-tokenizer {part['type']} making a text one word"
    model = tokenizer.model
    if not isinstance(model, (BPE, Unigram, WordPiece, WordLevel)) or (isinstance(model, BPE) and model.dropout):
        return None, f"model {type(model).__name__}"
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer else str
    for token in tokenizer.get_added_tokens_decoder().values():
        if STRADDLES_CUT.search(token.content) or (token.normalized and STRADDLES_CUT.search(normalize(token.content))):
            return None, f"added token {token.content!r} holds a space after a word"
    return cut, ""


def prefix_cut(tokenizer: Tokenizer) -> tuple[Cut | None, str]:
    """The cut that reads this tokenizer's long texts from a prefix (None where no argument covers it; a
    SpaceCut before a space), and how long texts are encoded, in words for the stage's log."""
    truncation = tokenizer.truncation
    if truncation and truncation["direction"] != "right":
        return None, "long texts encoded whole (truncation from the left)"
    if is_bert(tokenizer):
        if any(char in token.content for token in tokenizer.get_added_tokens_decoder().values() for char in CUT_CHARS):
            return None, "long texts encoded whole (an added token holds whitespace)"
        word_ends()  # built now rather than on the first long non-ASCII text
        return functools.partial(bert_bounded, words=BertWords.of(tokenizer)), "long texts read from a prefix"
    cut, refusal = _space_cut(tokenizer)
    if cut is None:
        return None, f"long texts encoded whole ({refusal})"
    return cut, "long texts read from a prefix"


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
