"""Packed outputs (common/contract.py PACKED_OUTPUTS: token vectors, late chunks) joined from several requests and
split back into parts by each text's count, as the client joins a request it sent in parts and the API front's
coalescer splits one call among its requests (protocol/packed.py)."""

from __future__ import annotations

import numpy as np

from common.contract import SPARSE_INDICES, TOKEN_COUNTS, TOKEN_VECTORS, TOKENS_OUTPUT
from protocol.multi_vector import token_vectors
from protocol.packed import join_outputs, per_text, split_outputs


def answer(counts: list[int], start: float) -> dict[str, np.ndarray]:
    """A request's answer: each text's `count` vectors (numbered from `start`), a padded sparse output, tokens."""
    rows = np.arange(start, start + 2 * sum(counts), dtype=np.float16).reshape(-1, 2)
    width = max(counts)
    sparse = np.array([[index] * count + [-1] * (width - count) for index, count in enumerate(counts)], np.int32)
    return {
        TOKEN_VECTORS: rows,
        TOKEN_COUNTS: np.array(counts, np.int32).reshape(-1, 1),
        SPARSE_INDICES: sparse,
        TOKENS_OUTPUT: np.array(counts, np.int32).reshape(-1, 1) + 2,
    }


def test_joined_parts_split_back_into_the_same_parts():
    parts = [answer([3, 0, 2], 0), answer([1], 100), answer([0, 4], 200)]
    joined = join_outputs(parts)
    assert joined[TOKEN_VECTORS].shape == (10, 2), "packed rows are concatenated, never padded"
    assert joined[SPARSE_INDICES].shape == (6, 4), "a padded output is padded to the widest part"
    for got, sent in zip(split_outputs(joined, [3, 1, 2]), parts, strict=True):
        for name in (TOKEN_VECTORS, TOKEN_COUNTS, TOKENS_OUTPUT):
            np.testing.assert_array_equal(got[name], sent[name])
        np.testing.assert_array_equal(got[SPARSE_INDICES][:, : sent[SPARSE_INDICES].shape[1]], sent[SPARSE_INDICES])


def test_each_texts_vectors_are_views_of_the_packed_rows():
    outputs = answer([2, 0, 3], 0)
    vectors = token_vectors(outputs)
    assert [len(rows) for rows in vectors] == [2, 0, 3]
    assert all(np.shares_memory(rows, outputs[TOKEN_VECTORS]) for rows in vectors if len(rows))
    np.testing.assert_array_equal(np.concatenate(per_text(outputs[TOKEN_VECTORS], outputs[TOKEN_COUNTS])),
                                  outputs[TOKEN_VECTORS])  # fmt: skip
    widened = token_vectors(outputs, np.float32)
    assert widened[2].dtype == np.float32
    np.testing.assert_array_equal(widened[2], vectors[2])
