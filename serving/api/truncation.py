"""What the API's callers ask of truncation beyond the stages' own (they keep a text's first max_tokens): TEI's
`truncate: false` (a text over the limit is refused), `truncation_direction: Left` (its last tokens are kept)
and Cohere's `max_tokens_per_doc`. Each works on the text before it is sent, with the model's own tokenizer
untruncated, so that what Triton tokenizes is a shorter text whose tokens are the ones asked for."""

from __future__ import annotations

from tokenizers import Encoding

from serving.api.models import ServedModel
from serving.api.schema import ApiError


def _inner(encoding: Encoding) -> list[int]:
    """Positions of the encoding's tokens that are the text's own (not [CLS] or [SEP])."""
    return [i for i, special in enumerate(encoding.special_tokens_mask) if not special]


def _word_start(encoding: Encoding, position: int) -> bool:
    """Whether the token at `position` begins a word (a WordPiece continuation, ##ing, does not)."""
    return not encoding.tokens[position].startswith("##")


def refuse_over_limit(model: ServedModel, texts: list[str] | list[tuple[str, str]], param: str = "inputs") -> None:
    """truncate: false: a text (or a reranker's (query, text) pair) the model would truncate is refused, as TEI
    refuses it (413)."""
    limit = model.settings.model.max_tokens
    for index, encoding in enumerate(model.whole.encode_batch(texts)):
        if len(encoding.ids) > limit:
            where = param if len(texts) == 1 else f"{param}[{index}]"
            raise ApiError(
                413,
                f"'{where}' has {len(encoding.ids)} tokens; the model takes at most {limit} (truncate is false)",
                where,
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
    room = model.settings.model.max_tokens - 2  # [CLS], [SEP]

    def cut(text: str, encoding: Encoding, inner: list[int]) -> str:
        first = len(inner) - room
        while first < len(inner) and not _word_start(encoding, inner[first]):
            first += 1
        return text[encoding.offsets[inner[first]][0] :] if first < len(inner) else ""

    return _over(model, texts, room, cut)


def keep_first(model: ServedModel, texts: list[str], tokens: int) -> list[str]:
    """Each text cut after its first `tokens` tokens (Cohere's max_tokens_per_doc), at a word's start."""

    def cut(text: str, encoding: Encoding, inner: list[int]) -> str:
        last = tokens
        while last > 0 and not _word_start(encoding, inner[last]):
            last -= 1
        return text[: encoding.offsets[inner[last]][0]].rstrip()

    return _over(model, texts, tokens, cut)
