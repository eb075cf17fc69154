"""A text stage's input: each request's TYPE_STRING texts, checked against the size limits before anything is
decoded (tokenizer.max_text_bytes, max_request_bytes, valid UTF-8), and the tokenizer they go to.

A refused request is named with its reason and the other requests of the batch are served (gather_texts).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .text_tokenizer import TextTokenizer, word_ends


def request_texts(raw: np.ndarray, max_text_bytes: int, max_request_bytes: int) -> list[str]:
    """The texts of one request's TYPE_STRING input, or ValueError naming what is wrong with them.

    Sizes are checked before anything is decoded: they bound what one text and one request can cost, also
    where the prefix fast paths cannot help."""
    raw = raw.reshape(-1)
    if raw.size == 0:
        raise ValueError("text: the batch holds no texts")
    sizes = [len(item) if isinstance(item, bytes) else len(str(item).encode()) for item in raw]
    if sum(sizes) > max_request_bytes:
        raise ValueError(
            f"the request's {len(sizes)} texts are {sum(sizes)} bytes together, over the limit of "
            f"{max_request_bytes} (tokenizer.max_request_bytes)"
        )
    texts = []
    for index, (item, size) in enumerate(zip(raw, sizes, strict=True)):
        if size > max_text_bytes:
            raise ValueError(
                f"text[{index}] is {size} bytes, over the limit of {max_text_bytes} (tokenizer.max_text_bytes)"
            )
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"text[{index}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        texts.append(str(item))
    return texts


def gather_texts(
    raws: list[np.ndarray], max_text_bytes: int, max_request_bytes: int
) -> tuple[list[str], list[slice | str]]:
    """Every request's texts in one list (tokenized in one call), and per request the slice of that list
    holding its texts, or the message saying why it is refused (the other requests are served)."""
    texts: list[str] = []
    parts: list[slice | str] = []
    for raw in raws:
        try:
            decoded = request_texts(raw, max_text_bytes, max_request_bytes)
        except ValueError as exc:
            parts.append(str(exc))
            continue
        parts.append(slice(len(texts), len(texts) + len(decoded)))
        texts.extend(decoded)
    return texts, parts


class TextInput:
    """A text stage's tokenizer and request limits, from its config parameters (tokenizer_model, pipeline_model)."""

    def __init__(self, version_dir: Path, params: dict[str, str], instances: int) -> None:
        if instances > 1:
            # Parallelism then comes from the instances; a thread pool per instance would oversubscribe the cores.
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.tokenizer = TextTokenizer.from_file(version_dir / "tokenizer.json", int(params["max_tokens"]))
        word_ends()  # built now rather than on the first long non-ASCII text
        self.max_text_bytes = int(params["max_text_bytes"])
        self.max_request_bytes = int(params["max_request_bytes"])

    def gather(self, raws: list[np.ndarray]) -> tuple[list[str], list[slice | str]]:
        return gather_texts(raws, self.max_text_bytes, self.max_request_bytes)
