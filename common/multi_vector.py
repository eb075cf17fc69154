"""serving.json's multi_vector: how a multi-vector model's stage prepares each side (export/multi_vector_export.py
writes it, model_repository/stages/multi_vector_output.py reads it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # encode_document's order


@dataclass(frozen=True)
class MultiVectorSpec:
    """How each side is tokenized and which tokens keep a vector (serving.json's multi_vector)."""

    query_prompt: str
    document_prompt: str
    query_max_tokens: int  # truncation of a query, its specials and prompt included
    document_max_tokens: int
    expansion_id: int | None  # the token queries are padded with; None: no query expansion
    expansion_length: int  # pad target of a query (with expansion)
    expansion_strategy: str  # fixed (truncated to the length too) | min
    expansion_attended: bool  # whether the encoder attends to the expansion tokens
    skiplist_ids: tuple[int, ...]  # tokens without a vector on the skiplist's sides
    skiplist_query: bool
    skiplist_document: bool

    @classmethod
    def from_dict(cls, raw: dict) -> MultiVectorSpec:
        return cls(**{**raw, "skiplist_ids": tuple(raw["skiplist_ids"])})

    def as_dict(self) -> dict:
        return {**asdict(self), "skiplist_ids": list(self.skiplist_ids)}
