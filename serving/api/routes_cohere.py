"""Cohere's rerank: POST /v2/rerank and /v1/rerank, the calls Cohere's SDK (ClientV2.rerank, Client.rerank)
and the LangChain and LlamaIndex rerankers built on it make. Scores are the sigmoid of the reranker's logit;
documents over max_tokens_per_doc tokens are cut to it first."""

from __future__ import annotations

import uuid

from aiohttp import web

from serving.api.routes_tei import pair_scores
from serving.api.schema import cohere_rerank_request, cohere_response, sigmoid
from serving.api.service import answer, api_of, read_json
from serving.api.truncation import keep_first


def rerank(version: str):
    async def handler(request: web.Request) -> web.Response:
        api = api_of(request)
        body = await read_json(request)
        model = api.models.named(body.get("model") if isinstance(body, dict) else None, "rerank")
        parsed = cohere_rerank_request(body, model.limits)
        documents = parsed.documents
        per_doc = body.get("max_tokens_per_doc")
        if per_doc is not None and per_doc < model.settings.model.max_tokens:
            texts = keep_first(model, [document.decode("utf-8") for document in documents], per_doc)
            documents = [text.encode("utf-8") for text in texts]
        scores = sigmoid(await pair_scores(request, model, parsed.query, documents))
        return answer(cohere_response(scores, parsed, str(uuid.uuid4()), version))

    return handler


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v2/rerank", rerank("2"))
    router.add_post("/v1/rerank", rerank("1"))
