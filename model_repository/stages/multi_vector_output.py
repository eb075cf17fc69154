"""A multi-vector model's requests and answers (ColBERT through MultiVectorEncoder): each text tokenized as its side
asks, and each text's kept token vectors.

A request's side is its KServe parameter input_type (query | document; document when absent). A query is its
prompt and text truncated to the query length, and with query expansion padded up to the expansion length with the
expansion token ([MASK]), which the encoder attends to only where the checkpoint says so but which keep a vector;
a document is its prompt and text truncated to the document length, its skiplist tokens (punctuation) keeping no
vector. The token ids are MultiVectorEncoder.preprocess's (tests/model/test_multi_vector.py).

The engine gives the kept tokens' vectors, packed, in its own precision (fp16 off a GPU); the answer is per request its
texts' share of them as they came, fp16 (token_vectors) or fp32 (token_vectors_fp32), and token_counts int32
[texts, 1].
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.contract import INPUT_TYPE, INPUT_TYPES, TOKEN_COUNTS, TOKEN_VECTORS, TOKEN_VECTORS_FP32
from common.multi_vector import MultiVectorSpec

from .text_tokenizer import TextTokenizer


class MultiVectorSides:
    """The two sides' tokenizers and which tokens keep a vector."""

    def __init__(self, tokenizer_json: Path, raw_spec: dict) -> None:
        self.spec = spec = MultiVectorSpec.from_dict(raw_spec)
        self.query = TextTokenizer.from_file(tokenizer_json, spec.query_max_tokens)
        self.document = TextTokenizer.from_file(tokenizer_json, spec.document_max_tokens)
        self.skiplist = np.array(spec.skiplist_ids, dtype=np.int32)

    @staticmethod
    def side(parameters: str) -> str:
        """A request's side, from its parameters (JSON, as the Python backend gives them); ValueError naming it."""
        side = json.loads(parameters or "{}").get(INPUT_TYPE, "document")
        if side not in INPUT_TYPES:
            raise ValueError(f"parameter {INPUT_TYPE} must be one of {', '.join(INPUT_TYPES)}, not {side!r}")
        return side

    def encode(self, texts: list[str], side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, lengths, attended, kept), packed: attended 1 where the encoder attends to the token (int32, the
        engine's third input), kept where the token keeps a vector (bool)."""
        spec, query = self.spec, side == "query"
        tokenizer, prompt = (self.query, spec.query_prompt) if query else (self.document, spec.document_prompt)
        ids, lengths = tokenizer.encode([prompt + text for text in texts])
        attended = np.ones(len(ids), dtype=np.int32)
        if query and spec.expansion_id is not None:
            ids, lengths, attended = expand(ids, lengths, spec)
        kept = np.ones(len(ids), dtype=bool)
        if len(self.skiplist) and (spec.skiplist_query if query else spec.skiplist_document):
            kept = ~np.isin(ids, self.skiplist)
        return ids, lengths, attended, kept


def expand(ids: np.ndarray, lengths: np.ndarray, spec: MultiVectorSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query padded up to the expansion length with the expansion token, attended where the spec says."""
    grown = np.maximum(lengths, spec.expansion_length)
    starts, new_starts = np.cumsum(lengths) - lengths, np.cumsum(grown) - grown
    out = np.full(int(grown.sum()), spec.expansion_id, dtype=np.int32)
    attended = np.full(len(out), int(spec.expansion_attended), dtype=np.int32)
    for start, new_start, length in zip(starts, new_starts, lengths, strict=True):
        out[new_start : new_start + length] = ids[start : start + length]
        attended[new_start : new_start + length] = 1
    return out, grown, attended


def packed(rows: np.ndarray, lengths: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A request's texts' rows [rows, dim] (a token's each, or a late chunk's), each text's rows and which of them
    are kept: the kept rows, packed as they came (no copy when all are), and each text's count (int32 [texts, 1])."""
    counts = kept_counts(lengths, kept)
    return (rows if kept.all() else rows[kept]), counts.astype(np.int32).reshape(-1, 1)


def kept_counts(lengths: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """How many of each text's rows are kept."""
    return np.bincount(np.repeat(np.arange(len(lengths)), lengths)[kept], minlength=len(lengths))


def vector_outputs(rows: np.ndarray, counts: np.ndarray, asked) -> dict[str, np.ndarray]:
    """One request's token-vector outputs (common/contract.py) from its texts' kept vectors, packed, and each text's
    count: fp16 unless it asks for fp32 alone."""
    counts = counts.astype(np.int32).reshape(-1, 1)
    if TOKEN_VECTORS_FP32 in asked and TOKEN_VECTORS not in asked:
        return {TOKEN_VECTORS_FP32: rows.astype(np.float32, copy=False), TOKEN_COUNTS: counts}
    return {TOKEN_VECTORS: rows.astype(np.float16, copy=False), TOKEN_COUNTS: counts}
