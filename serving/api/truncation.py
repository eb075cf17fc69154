"""What the API's callers ask of truncation beyond the stages' own (they keep a text's first max_tokens): TEI's
`truncate: false` (a text over the limit is refused), `truncation_direction: Left` (its last tokens are kept),
Cohere's `max_tokens_per_doc` and its embed's `truncate` (NONE refuses, START keeps the end). Each works on the
text before it is sent, with the model's own tokenizer untruncated, so that what Triton tokenizes is a shorter
text whose tokens are the ones asked for: cut where a word starts as the tokenizer splits words (WordPiece,
byte-level BPE or Unigram alike), the special tokens counted by the tokenizer."""

from __future__ import annotations

from tokenizers import Encoding

from serving.api.models import ServedModel
from serving.api.schema import ApiError


def _inner(encoding: Encoding) -> list[int]:
    """Positions of the encoding's tokens that are the text's own (not the special tokens around it)."""
    return [i for i, sequence in enumerate(encoding.sequence_ids) if sequence is not None]


def _word_start(encoding: Encoding, position: int) -> bool:
    """Whether the token at `position` begins a word as the tokenizer's pre-tokenizer split the text (a WordPiece
    continuation, ##ing, or a byte-level BPE or Unigram piece after a word's first, does not)."""
    word_ids = encoding.word_ids
    return position == 0 or word_ids[position - 1] != word_ids[position]


def refuse_over_limit(
    model: ServedModel,
    texts: list[str] | list[tuple[str, str]],
    param: str = "inputs",
    status: int = 413,
    setting: str = "truncate is false",
) -> None:
    """TEI's truncate: false, Cohere's truncate: NONE: a text (or a reranker's (query, text) pair) the model would
    truncate is refused, as TEI refuses it (413) or Cohere (400)."""
    limit = model.max_tokens
    for index, encoding in enumerate(model.whole.encode_batch(texts)):
        if len(encoding.ids) > limit:
            where = param if len(texts) == 1 else f"{param}[{index}]"
            raise ApiError(
                status, f"'{where}' has {len(encoding.ids)} tokens; the model takes at most {limit} ({setting})", where
            )


def _over(model: ServedModel, texts: list[str], room: int, cut) -> list[str]:
    """Each text with more than `room` tokens of its own replaced by cut(text, encoding, its own positions)."""
    return [
        text if len(inner := _inner(encoding)) <= room else cut(text, encoding, inner)
        for text, encoding in zip(texts, model.whole.encode_batch(texts), strict=True)
    ]


def keep_last(model: ServedModel, texts: list[str]) -> list[str]:
    """truncation_direction: Left: each text cut so that its last tokens are what the model keeps. The cut goes
    at a word's start, so a word cut in two is dropped whole rather than read as another word."""
    room = model.max_tokens - model.whole.num_special_tokens_to_add(False)

    def cut(text: str, encoding: Encoding, inner: list[int]) -> str:
        first = len(inner) - room
        while first < len(inner) and not _word_start(encoding, inner[first]):
            first += 1
        if first == len(inner):
            return ""
        # From the end of the token before: byte-level BPE (Ġword) and Metaspace (▁word) read the whitespace
        # before a word as its own start, so it stays.
        return text[encoding.offsets[inner[first - 1]][1] :]

    return _over(model, texts, room, cut)


def keep_first(model: ServedModel, texts: list[str], tokens: int) -> list[str]:
    """Each text cut after its first `tokens` tokens (Cohere's max_tokens_per_doc), at a word's start."""

    def cut(text: str, encoding: Encoding, inner: list[int]) -> str:
        last = tokens
        while last > 0 and not _word_start(encoding, inner[last]):
            last -= 1
        return text[: encoding.offsets[inner[last]][0]].rstrip()

    return _over(model, texts, tokens, cut)
