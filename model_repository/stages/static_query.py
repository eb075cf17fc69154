"""An inference-free sparse model's queries (sentence-transformers' SparseStaticEmbedding on a Router's query side,
OpenSearch's doc-only models): a query's vector is the static weight of each distinct token it holds, read without
the engine. A request asks for it with input_type = "query"; documents go through the engine as any sparse text.

As SparseStaticEmbedding reads a query: tokenized without special tokens, truncated to max_tokens, each token id
present once with its weight (STATIC_QUERY_FILE)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.contract import INPUT_TYPE, STATIC_QUERY_FILE
from common.hf_tokenizer import load_tokenizer

from .engines.sparse import SparseRow, SparseRows


def asks_for_queries(parameters: str) -> bool:
    return json.loads(parameters or "{}").get(INPUT_TYPE) == "query"


class StaticQuery:
    def __init__(self, version_dir: Path, max_tokens: int) -> None:
        self.weights = np.load(version_dir / STATIC_QUERY_FILE).astype(np.float32, copy=False)
        self.tokenizer = load_tokenizer(version_dir / "tokenizer.json", max_tokens)

    def rows(self, texts: list[str]) -> tuple[SparseRows, np.ndarray]:
        """Each query's non-zero entries (ascending index) and its token count."""
        rows, lengths = [], []
        for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False):
            ids = np.unique(np.asarray(encoding.ids, dtype=np.int32))
            values = self.weights[ids]
            keep = values > 0
            rows.append(SparseRow(ids[keep], values[keep]))
            lengths.append(len(encoding.ids))
        return SparseRows.joined(rows), np.asarray(lengths, dtype=np.int32)
