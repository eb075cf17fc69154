"""A hybrid (BGE-M3) model's POST /encode: whichever of its three outputs a request asks for, from one pass of
the encoder, named and shaped as FlagEmbedding's BGEM3FlagModel.encode returns them, so that code written against
it reads the answer unchanged:

    {"inputs": str | [str], "return_dense": true, "return_sparse": false, "return_colbert_vecs": false,
     "truncate": true, "top_k": k, "threshold": t}
    -> {"dense_vecs": [[float]], "lexical_weights": [{"<token id>": weight}], "colbert_vecs": [[[float]]]}

(only the asked ones; top_k and threshold cut the lexical weights as /embed_sparse's do). The routes of each
output alone take a hybrid model too: /v1/embeddings, /embed, /v2/embed (dense), /embed_sparse and /embed_all.
Requests name no model: each goes to the first served hybrid model."""

from __future__ import annotations

import numpy as np
from aiohttp import web

from common.contract import SPARSE_INDICES, SPARSE_VALUES, TEXT_INPUT, TOKEN_COUNTS, TOKEN_VECTORS
from protocol.multi_vector import token_vectors
from protocol.sparse import entries
from serving.api.routes_tei import prepared, sparse_parameters
from serving.api.schema import ApiError, tei_request
from serving.api.service import answer, api_of, read_json

RETURNS = {
    "return_dense": ("dense_vecs", ["embedding"]),
    "return_sparse": ("lexical_weights", [SPARSE_INDICES, SPARSE_VALUES]),
    "return_colbert_vecs": ("colbert_vecs", [TOKEN_VECTORS, TOKEN_COUNTS]),
}
DEFAULTS = {"return_dense": True, "return_sparse": False, "return_colbert_vecs": False}  # BGEM3FlagModel.encode's
ENCODE_FIELDS = frozenset({*RETURNS, "truncate", "top_k", "threshold"})


async def encode(request: web.Request) -> web.Response:
    model = api_of(request).models.for_task("hybrid")
    encoded, body = tei_request(await read_json(request), model.limits, ENCODE_FIELDS)
    asked = []
    for field, default in DEFAULTS.items():
        value = body.get(field, default)
        if not isinstance(value, bool):
            raise ApiError(400, f"'{field}' must be true or false", field)
        asked += [field] if value else []
    if not asked:
        raise ApiError(400, f"ask for at least one of {', '.join(RETURNS)}", "return_dense")
    outputs = [name for field in asked for name in RETURNS[field][1]]
    parameters = sparse_parameters(body) if "return_sparse" in asked else {}
    got = await api_of(request).infer(model, {TEXT_INPUT: prepared(model, encoded, body)}, outputs, parameters or None)
    result = {}
    if "return_dense" in asked:
        result["dense_vecs"] = got["embedding"]
    if "return_sparse" in asked:
        result["lexical_weights"] = [
            {str(index): value for index, value in zip(indices.tolist(), values.tolist(), strict=True)}
            for indices, values in entries(got)
        ]
    if "return_colbert_vecs" in asked:
        result["colbert_vecs"] = [vectors.tolist() for vectors in token_vectors(got, np.float32)]
    return answer(result)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/encode", encode)
