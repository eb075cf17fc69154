"""Late chunking of an embedder's texts (a request's KServe parameter chunk_tokens = N): each text read in one
pass, its own tokens (the special tokens around them left out) cut into consecutive chunks of N, the last one
shorter, and each chunk's token states mean-pooled (engine.pool_spans: the torch engine; normalized as the model's
embeddings are). A chunk sees the whole text, which a text cut before encoding does not (Jina AI's "late
chunking"). The answer per request: chunk_embeddings packed [its chunks, dim], chunk_counts [texts, 1]; a text of
no token of its own has no chunk."""

from __future__ import annotations

import json

import numpy as np

from common.contract import CHUNK_COUNTS, CHUNK_EMBEDDINGS, CHUNK_TOKENS

from .multi_vector_output import packed


def chunk_size(parameters: str) -> int | None:
    """A request's chunk_tokens (None: no late chunking); ValueError naming a bad one."""
    size = json.loads(parameters or "{}").get(CHUNK_TOKENS)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"parameter {CHUNK_TOKENS} must be an integer >= 1, not {size!r}")
    return size


class LateChunking:
    def __init__(self, leading: int, trailing: int) -> None:
        self.leading, self.trailing = leading, trailing  # special tokens before and after a text's own

    def spans(self, lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bounds, per text its span count, kept): the packed stream cut into spans, each text's leading specials,
        its chunks, its trailing specials, bounds from 0 to every token; kept marks the chunks."""
        bounds, per_text, kept, start = [0], [], [], 0
        for length in lengths.tolist():
            own_start, own_end = start + self.leading, start + length - self.trailing
            edges = [*([own_start] if self.leading else []), *range(own_start + size, own_end, size)]
            edges += [own_end] if own_end > own_start else []
            edges += [start + length] if self.trailing or own_end <= own_start else []
            spans = [edge for edge in edges if edge > bounds[-1]]
            chunk_flags = [own_start <= first < own_end for first in [bounds[-1], *spans[:-1]]]
            bounds += spans
            kept += chunk_flags
            per_text.append(len(spans))
            start += length
        return np.array(bounds, dtype=np.int64), np.array(per_text, dtype=np.int64), np.array(kept, dtype=bool)

    def tensors(self, pooled: np.ndarray, per_text: np.ndarray, kept: np.ndarray) -> dict[str, np.ndarray]:
        """One request's outputs from its texts' spans' pooled rows."""
        rows, counts = packed(pooled, per_text, kept)
        return {CHUNK_EMBEDDINGS: rows, CHUNK_COUNTS: counts}
