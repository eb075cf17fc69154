"""A text stage's input: each request's TYPE_STRING texts, checked against the size limits before anything is
decoded (tokenizer.max_text_bytes, max_request_bytes, valid UTF-8), and the tokenizer they go to.

A refused request is named with its reason and the other requests of the batch are served (gather_texts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .text_tokenizer import TextTokenizer

log = logging.getLogger(__name__)


def _sizes(raw: np.ndarray) -> list[int]:
    return [len(item) if isinstance(item, bytes) else len(str(item).encode()) for item in raw]


def request_texts(
    raw: np.ndarray, max_text_bytes: int, max_request_bytes: int, name: str = "text", beside: int = 0
) -> list[str]:
    """The texts of one request's TYPE_STRING input, or ValueError naming what is wrong with them; `beside` is
    what the request's other input (a reranker's queries) already holds of max_request_bytes.

    Sizes are checked before anything is decoded: they bound what one text and one request can cost, also
    where the prefix fast paths cannot help."""
    raw = raw.reshape(-1)
    if raw.size == 0:
        raise ValueError(f"{name}: the batch holds no texts")
    sizes = _sizes(raw)
    if sum(sizes) + beside > max_request_bytes:
        raise ValueError(
            f"the request's {len(sizes)} texts are {sum(sizes) + beside} bytes together, over the limit of "
            f"{max_request_bytes} (tokenizer.max_request_bytes)"
        )
    texts = []
    for index, (item, size) in enumerate(zip(raw, sizes, strict=True)):
        if size > max_text_bytes:
            raise ValueError(
                f"{name}[{index}] is {size} bytes, over the limit of {max_text_bytes} (tokenizer.max_text_bytes)"
            )
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{name}[{index}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        texts.append(str(item))
    return texts


def request_pairs(
    query_raw: np.ndarray, text_raw: np.ndarray, max_text_bytes: int, max_request_bytes: int
) -> tuple[list[str], list[str]]:
    """A reranker request's (queries, texts), one query per text, checked as request_texts checks texts."""
    query_raw, text_raw = query_raw.reshape(-1), text_raw.reshape(-1)
    if query_raw.size != text_raw.size:
        raise ValueError(f"query and text need one row each per pair: {query_raw.size} queries, {text_raw.size} texts")
    queries = request_texts(query_raw, max_text_bytes, max_request_bytes, "query")
    return queries, request_texts(text_raw, max_text_bytes, max_request_bytes, "text", sum(_sizes(query_raw)))


def gather(requests: list[tuple[np.ndarray, ...]], decode) -> tuple[list[tuple[str, ...]], list[slice | str]]:
    """Every request's decoded rows in one list (tokenized in one call), and per request the slice of that
    list holding its rows, or the message saying why it is refused (the other requests are served)."""
    rows: list = []
    parts: list[slice | str] = []
    for inputs in requests:
        try:
            decoded = list(zip(*decode(*inputs), strict=True))
        except ValueError as exc:
            parts.append(str(exc))
            continue
        parts.append(slice(len(rows), len(rows) + len(decoded)))
        rows.extend(decoded)
    return rows, parts


def gather_texts(
    raws: list[np.ndarray], max_text_bytes: int, max_request_bytes: int
) -> tuple[list[str], list[slice | str]]:
    """gather for one text input per request: the texts, and each request's slice of them or its refusal."""
    rows, parts = gather([(raw,) for raw in raws], lambda raw: (request_texts(raw, max_text_bytes, max_request_bytes),))
    return [text for (text,) in rows], parts


class TextInput:
    """A text stage's tokenizer and request limits, from its config parameters (tokenizer_model, pipeline_model)."""

    def __init__(
        self,
        version_dir: Path,
        params: dict[str, str],
        instances: int,
        log_info: Callable[[str], None] = log.info,
    ) -> None:
        """log_info takes the line naming the tokenizer's paths (the stages pass pb_utils.Logger.log_info: Triton's
        log, beside the engine's)."""
        if instances > 1:
            # Parallelism then comes from the instances; a thread pool per instance would oversubscribe the cores.
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.tokenizer = TextTokenizer.from_file(version_dir / "tokenizer.json", int(params["max_tokens"]))
        log_info(f"tokenizer: {self.tokenizer.path}")
        self.max_text_bytes = int(params["max_text_bytes"])
        self.max_request_bytes = int(params["max_request_bytes"])

    def special_tokens(self) -> tuple[int, int]:
        """How many special tokens the tokenizer puts before a text's own and after them ([CLS] ... [SEP]: 1, 1)."""
        added = self.tokenizer.tokenizer.num_special_tokens_to_add(False)
        return min(added, 1), added - min(added, 1)

    def gather(
        self, raws: list[np.ndarray], prompts: list[str | ValueError] | None = None
    ) -> tuple[list[str], list[slice | str]]:
        """Every request's texts and its slice of them or its refusal; with `prompts`, each request's texts behind
        its prompt (an error refuses the request)."""
        if prompts is None:
            return gather_texts(raws, self.max_text_bytes, self.max_request_bytes)

        def decode(raw: np.ndarray, prompt: str | ValueError) -> tuple[list[str]]:
            if isinstance(prompt, ValueError):
                raise prompt
            return ([prompt + text for text in request_texts(raw, self.max_text_bytes, self.max_request_bytes)],)

        rows, parts = gather(list(zip(raws, prompts, strict=True)), decode)
        return [text for (text,) in rows], parts

    def gather_pairs(
        self, query_raws: list[np.ndarray], text_raws: list[np.ndarray]
    ) -> tuple[list[str], list[str], list[slice | str]]:
        """Every request's (query, text) pairs as two lists, and each request's slice of them or its refusal."""

        def decode(query_raw, text_raw):
            return request_pairs(query_raw, text_raw, self.max_text_bytes, self.max_request_bytes)

        rows, parts = gather(list(zip(query_raws, text_raws, strict=True)), decode)
        return [query for query, _ in rows], [text for _, text in rows], parts

    def tokenize(
        self,
        text_raws: list[np.ndarray],
        query_raws: list[np.ndarray] | None = None,
        prompts: list[str | ValueError] | None = None,
    ) -> tuple[list[slice | str], np.ndarray, np.ndarray, np.ndarray | None]:
        """Every request's texts (with query_raws: its (query, text) pairs) gathered and tokenized in one call:
        each request's slice of the rows or its refusal, then the packed ids, lengths and token types (pairs).
        prompts: each request's prompt before its texts (gather)."""
        if query_raws is None:
            texts, parts = self.gather(text_raws, prompts)
            ids, lengths = self.tokenizer.encode(texts)
            return parts, ids, lengths, None
        queries, texts, parts = self.gather_pairs(query_raws, text_raws)
        return parts, *self.tokenizer.encode_pairs(queries, texts)
