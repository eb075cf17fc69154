"""A hybrid model's (BGE-M3's) answer to one request: of its dense vectors, lexical weights and colbert vectors, the
outputs the request asks for (KServe's requested outputs; all when it names none), from the one pass the engine
made for the whole batch (engines/hybrid.py HybridRows), which copies out only what some request of the batch asks
for. The lexical weights are cut as a sparse model's are
(sparse_output.py: sparse_top_k, sparse_threshold), the colbert vectors answered as a multi-vector model's, every
token's but the first (multi_vector_output.vector_outputs), which the engine copied out alone."""

from __future__ import annotations

import numpy as np

from common.contract import SPARSE_INDICES, SPARSE_VALUES, TOKEN_COUNTS, TOKEN_VECTORS, TOKEN_VECTORS_FP32

from .engines.hybrid import HybridRows, lexical_rows, wanted_outputs
from .multi_vector_output import vector_outputs
from .sparse_output import SparseOutput


class HybridOutput:
    def __init__(self, params: dict[str, str], hybrid: dict) -> None:
        self.sparse = SparseOutput(params)
        self.unused = np.array(hybrid["unused_ids"], dtype=np.int32)

    @staticmethod
    def wanted(requests: list) -> frozenset[str]:
        """The engine outputs the batch's requests need."""
        return wanted_outputs(name for request in requests for name in request.requested_output_names())

    def tensors(self, rows: HybridRows, ids: np.ndarray, lengths: np.ndarray, texts: slice, tokens: slice,
                request) -> dict[str, np.ndarray]:  # fmt: skip
        """The request's outputs: its texts' rows and tokens of the batch's. ValueError naming a bad parameter."""
        asked = set(request.requested_output_names())
        own = lengths[texts]
        out = {}
        if "embedding" in asked:
            out["embedding"] = rows.dense[texts]
        if asked & {SPARSE_INDICES, SPARSE_VALUES}:
            lexical = lexical_rows(ids[tokens], own, rows.weights[tokens], self.unused)
            out |= self.sparse.tensors(lexical, request.parameters())
        if asked & {TOKEN_VECTORS, TOKEN_VECTORS_FP32, TOKEN_COUNTS}:
            # Each text's first token ([CLS], <s>) has no colbert vector: the batch's rows lack one per text before.
            vectors = rows.vectors[tokens.start - texts.start : tokens.stop - texts.stop]
            out |= vector_outputs(vectors, own - 1, asked)
        return out
