"""Long documents as windows: the request option `"chunking": {"overlap_tokens": N}` cuts each text into windows
the model reads whole (model.max_tokens tokens, the special tokens included), consecutive windows sharing N
tokens, and each window is embedded on its own; the answer gives every window with its character span [start,
end) in the original text (Python str indices: Unicode code points). A text that fits one window is one window
spanning it all, embedded as it would be without chunking.

Windows are cut at the token boundaries of the model's own tokenizer, untruncated, so each window's text is an
exact substring of the original. A substring can tokenize into more tokens than its share of the whole text did
(a byte-level BPE character split over two tokens, cut between them, comes back whole): every window is
tokenized again and, where it is over, shrunk by a token until it fits, so no window is truncated by the stages.

Late chunking, `"chunking": {"late_chunk_tokens": M}` (with overlap_tokens or not): each window is read in one pass
and its own tokens are cut into chunks of M, each chunk's token states mean-pooled (the stage's late_chunking.py,
the torch engine's pool_spans), so that a chunk's vector carries what the rest of its window says; the answer
gives every chunk with its character span. A long-context model (ModernBERT: 8,192 tokens) reads a whole
document in one window."""

from __future__ import annotations

from dataclasses import dataclass

from serving.api.models import ServedModel
from serving.api.schema import ApiError

# Fields that change what a text is before it is read; a window is a span of the text as sent, so they are refused.
EXCLUSIVE = ("prompt_name", "truncate", "truncation_direction")


@dataclass(frozen=True)
class Chunking:
    overlap: int  # tokens consecutive windows share
    late_tokens: int | None  # late chunking: chunks of this many tokens pooled from each window's pass


@dataclass(frozen=True)
class Window:
    text_index: int  # which text of the request
    start: int  # [start, end) in that text's characters
    end: int

    @property
    def span(self) -> list[int]:
        return [self.start, self.end]


def text_room(model: ServedModel) -> int:
    """How many of the text's own tokens one window holds: max_tokens less the special tokens around them."""
    return model.max_tokens - model.whole.num_special_tokens_to_add(False)


def requested_chunking(body: dict, model: ServedModel) -> Chunking | None:
    """The request's chunking (overlap_tokens 0 when the object gives none); None when it asks for no chunking.
    Every bad field is a 400 naming it."""
    chunking = body.get("chunking")
    if chunking is None:
        return None
    if not isinstance(chunking, dict):
        message = '\'chunking\' must be an object, {"overlap_tokens": int, "late_chunk_tokens": int}'
        raise ApiError(400, message, "chunking")
    unknown = sorted(set(chunking) - {"overlap_tokens", "late_chunk_tokens"})
    if unknown:
        raise ApiError(400, f"unknown fields: chunking.{unknown[0]}", f"chunking.{unknown[0]}")
    for field in EXCLUSIVE:
        if body.get(field) is not None:
            message = f"'{field}' does not combine with 'chunking': each window is a span of the text as sent"
            raise ApiError(400, message, field)
    if model.prompt(None):
        message = f"{model.name} reads every text behind its default prompt: a window would not be a span of the text"
        raise ApiError(400, message, "chunking")
    overlap, room = chunking.get("overlap_tokens", 0), text_room(model)
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < room:
        message = f"'chunking.overlap_tokens' must be an integer in 0..{room - 1}: {model.name}'s window holds {room}"
        raise ApiError(400, message, "chunking.overlap_tokens")
    late = chunking.get("late_chunk_tokens")
    if late is not None:
        if isinstance(late, bool) or not isinstance(late, int) or not 1 <= late <= room:
            message = (
                f"'chunking.late_chunk_tokens' must be an integer in 1..{room}: {model.name}'s window holds {room}"
            )
            raise ApiError(400, message, "chunking.late_chunk_tokens")
        if model.settings.topology != "one_stage":
            message = f"late chunking is answered by the one-stage model; {model.name} is served in two stages"
            raise ApiError(400, message, "chunking.late_chunk_tokens")
    return Chunking(overlap, late)


def _fits(model: ServedModel, text: str) -> bool:
    return len(model.whole.encode(text).ids) <= model.max_tokens


def text_spans(model: ServedModel, text: str, overlap: int) -> list[tuple[int, int]]:
    """The [start, end) character spans of one text's windows: the first from 0, the last to the text's end, each
    of at most text_room tokens and re-tokenizing to at most max_tokens, each sharing `overlap` tokens with the
    next."""
    return _spans(model, text, model.whole.encode(text, add_special_tokens=False).offsets, overlap)


def _spans(model: ServedModel, text: str, offsets: list[tuple[int, int]], overlap: int) -> list[tuple[int, int]]:
    room = text_room(model)
    if len(offsets) <= room:
        return [(0, len(text))]

    def end_of(last: int) -> int:  # the character after token last - 1; the text's end after its last token
        return len(text) if last == len(offsets) else offsets[last - 1][1]

    spans, first = [], 0
    while True:
        start = offsets[first][0] if first else 0
        last = min(first + room, len(offsets))  # one past the window's last token
        while last > first + 1 and not _fits(model, text[start : end_of(last)]):
            last -= 1
        spans.append((start, end_of(last)))
        if last == len(offsets):
            return spans
        first = max(last - overlap, first + 1)
        # Tokens of one character (byte-level BPE) share its span: the next window starts past this one's start.
        while first < len(offsets) - 1 and offsets[first][0] <= start:
            first += 1


def _planned(tokens: int, room: int, overlap: int) -> int:
    """How many windows `tokens` tokens make before any is shrunk (shrinking only adds)."""
    return 1 if tokens <= room else 1 + -(-(tokens - room) // (room - overlap))


def document_windows(model: ServedModel, texts: list[str], overlap: int, param: str) -> list[Window]:
    """Every text's windows in order; 413 naming the count when they are more than api.max_inputs, counted before
    they are cut so that a request of a million windows costs one tokenization."""
    encodings = model.whole.encode_batch(texts, add_special_tokens=False)
    room, limit = text_room(model), model.limits.max_inputs
    count = sum(_planned(len(encoding.ids), room, overlap) for encoding in encodings)
    windows = []
    if count <= limit:
        for index, (text, encoding) in enumerate(zip(texts, encodings, strict=True)):
            windows += [Window(index, start, end) for start, end in _spans(model, text, encoding.offsets, overlap)]
        count = len(windows)
    if count > limit:
        raise ApiError(413, f"'{param}' makes {count} windows; at most {limit} per request", param)
    return windows


def chunk_spans(model: ServedModel, text: str, size: int) -> list[tuple[int, int]]:
    """The [start, end) character spans of a window's late chunks: its own tokens, `size` at a time (the stage cuts
    the same tokens: the window's, which fit the model)."""
    offsets = model.whole.encode(text, add_special_tokens=False).offsets
    return [
        (offsets[first][0], offsets[min(first + size, len(offsets)) - 1][1]) for first in range(0, len(offsets), size)
    ]


def window_texts(texts: list[str], windows: list[Window]) -> list[bytes]:
    """Each window's text as UTF-8, as the model is to read it."""
    return [texts[window.text_index][window.start : window.end].encode("utf-8") for window in windows]
