"""A multi-vector model's requests and answers (ColBERT through MultiVectorEncoder): each text tokenized as its side
asks, and each text's kept token vectors.

A request's side is its KServe parameter input_type (query | document; document when absent). A query is its
prompt and text truncated to the query length, and with query expansion padded up to the expansion length with the
expansion token ([MASK]), which the encoder attends to only where the checkpoint says so but which keep a vector;
a document is its prompt and text truncated to the document length, its skiplist tokens (punctuation) keeping no
vector. The token ids are MultiVectorEncoder.preprocess's (tests/model/test_multi_vector.py).

The engine gives every token's vector (packed); the answer is per request token_vectors fp32 [texts, the most kept
tokens of a text, dim], zeros past a text's own, and token_counts int32 [texts, 1].
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.contract import INPUT_TYPE, INPUT_TYPES, TOKEN_COUNTS, TOKEN_VECTORS
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


def answer(vectors: np.ndarray, lengths: np.ndarray, kept: np.ndarray,
           names: tuple[str, str] = (TOKEN_VECTORS, TOKEN_COUNTS)) -> dict[str, np.ndarray]:  # fmt: skip
    """One request's outputs from its texts' packed vectors [rows, dim] (a token's each, or a late chunk's), each
    text's rows and which of them are kept: the kept ones per text, zero-padded, and their counts (`names`)."""
    text_of = np.repeat(np.arange(len(lengths)), lengths)[kept]
    counts = np.bincount(text_of, minlength=len(lengths))
    width = max(1, int(counts.max()) if len(counts) else 0)
    out = np.zeros((len(lengths), width, vectors.shape[1]), dtype=np.float32)
    places = np.arange(len(text_of)) - (np.cumsum(counts) - counts)[text_of]
    out[text_of, places] = vectors[kept]
    return {names[0]: out, names[1]: counts.astype(np.int32).reshape(-1, 1)}
