"""A multi-vector (ColBERT) model's routes: TEI's POST /embed_all, each text's token vectors, and POST
/colbert/score, the MaxSim score of each document for a query, ranked as /rerank answers. The side (query or
document) decides how the stage tokenizes a text: the request's input_type, or TEI's prompt_name where it names
one of the checkpoint's prompts (the stage prepends that side's prompt itself). Requests name no model: each
goes to the first served multi-vector model."""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from common.contract import INPUT_TYPE, INPUT_TYPES, TEXT_INPUT, TOKEN_COUNTS, TOKEN_VECTORS
from common.multi_vector import DOCUMENT_PROMPTS, MultiVectorSpec
from protocol.multi_vector import maxsim, token_vectors
from serving.api.models import ServedModel
from serving.api.schema import ApiError, query, tei_fields, tei_ranks, tei_request, text_list
from serving.api.service import answer, api_of, read_json

EMBED_ALL_FIELDS = frozenset({"truncate", "truncation_direction", "prompt_name", INPUT_TYPE})
SCORE_FIELDS = frozenset({"documents", "truncate", "return_text"})
PROMPT_SIDES = {"query": "query", **{name: "document" for name in DOCUMENT_PROMPTS}}


def side_of(body: dict) -> str:
    """The side a request asks for: input_type, or the side prompt_name names; document when neither does."""
    side, prompt_name = body.get(INPUT_TYPE), body.get("prompt_name")
    if side is not None and side not in INPUT_TYPES:
        raise ApiError(400, f"'{INPUT_TYPE}' must be one of {', '.join(INPUT_TYPES)}", INPUT_TYPE)
    if prompt_name is None:
        return side or "document"
    if prompt_name not in PROMPT_SIDES:
        names = ", ".join(PROMPT_SIDES)
        raise ApiError(400, f"'prompt_name' must name a side's prompt ({names}): the model adds it", "prompt_name")
    if side not in (None, PROMPT_SIDES[prompt_name]):
        raise ApiError(400, f"'prompt_name' {prompt_name!r} and '{INPUT_TYPE}' {side!r} ask for different sides")
    return PROMPT_SIDES[prompt_name]


def refuse_over_side(model: ServedModel, texts: list[bytes], side: str, param: str) -> None:
    """truncate: false: a text the side would cut (its prompt and special tokens counted) is a 413, as TEI's."""
    spec = MultiVectorSpec.from_dict(model.spec.multi_vector)
    query_side = side == "query"
    prompt = spec.query_prompt if query_side else spec.document_prompt
    limit = spec.query_max_tokens if query_side else spec.document_max_tokens
    for index, encoding in enumerate(model.whole.encode_batch([prompt + text.decode("utf-8") for text in texts])):
        if len(encoding.ids) > limit:
            where = param if len(texts) == 1 else f"{param}[{index}]"
            message = f"'{where}' has {len(encoding.ids)} tokens; a {side} takes at most {limit} (truncate is false)"
            raise ApiError(413, message, where)


async def side_vectors(request: web.Request, model: ServedModel, texts: list[bytes], side: str) -> list[np.ndarray]:
    """Each text's kept token vectors as the side encodes them: fp16 over gRPC, fp32 here (one copy)."""
    parameters = {INPUT_TYPE: side} if side == "query" else None  # the stage's default: documents coalesce
    outputs = await api_of(request).infer(model, {TEXT_INPUT: texts}, [TOKEN_VECTORS, TOKEN_COUNTS], parameters)
    return token_vectors(outputs, np.float32)


async def embed_all(request: web.Request) -> web.Response:
    """TEI's shape: [[[float, ...] per kept token] per text]."""
    model = api_of(request).models.for_task("multi_vector")
    texts, body = tei_request(await read_json(request), model.limits, EMBED_ALL_FIELDS)
    side = side_of(body)
    if (body.get("truncation_direction") or "right").lower() != "right":
        message = "a text keeps its first tokens: 'truncation_direction' must be Right"
        raise ApiError(400, message, "truncation_direction")
    if body.get("truncate") is False:
        refuse_over_side(model, texts, side, "inputs")
    return answer([vectors.tolist() for vectors in await side_vectors(request, model, texts, side)])


async def colbert_score(request: web.Request) -> web.Response:
    """{"query": str, "documents": [str, ...]} -> every document by MaxSim score, highest first: {index, score}."""
    model = api_of(request).models.for_task("multi_vector")
    body = tei_fields(await read_json(request), SCORE_FIELDS, "query")
    if "documents" not in body:
        raise ApiError(400, "'documents' is required", "documents")
    question, documents = query(body["query"], model.limits), text_list(body["documents"], "documents", model.limits)
    if body.get("truncate") is False:
        refuse_over_side(model, [question], "query", "query")
        refuse_over_side(model, documents, "document", "documents")
    (query_vectors,), document_vectors = await asyncio.gather(
        side_vectors(request, model, [question], "query"), side_vectors(request, model, documents, "document")
    )
    scores = np.array([maxsim(query_vectors, vectors) for vectors in document_vectors])
    return answer(tei_ranks(scores, documents, bool(body.get("return_text"))))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/embed_all", embed_all)
    router.add_post("/colbert/score", colbert_score)
