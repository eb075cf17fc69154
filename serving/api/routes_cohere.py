"""Cohere's routes: rerank (POST /v2/rerank, /v1/rerank) and embed (POST /v2/embed, /v1/embed), the calls Cohere's
SDK (ClientV2.rerank and .embed, Client.rerank and .embed) and the LangChain and LlamaIndex integrations built on
it make. Rerank scores are the sigmoid of the reranker's logit; documents over max_tokens_per_doc tokens are cut to
it first. Embed answers each asked embedding type (quantization.py), the texts read with the checkpoint's prompt
for the input type where it has one."""

from __future__ import annotations

import uuid

from aiohttp import web

from serving.api.models import ServedModel
from serving.api.quantization import encoded_rows
from serving.api.request_context import CURRENT
from serving.api.routes_openai import embed_texts
from serving.api.routes_tei import pair_scores
from serving.api.schema import (
    INPUT_TYPES,
    CohereEmbedRequest,
    cohere_embed_request,
    cohere_embed_response,
    cohere_rerank_request,
    cohere_response,
    sigmoid,
)
from serving.api.service import answer, api_of, read_json
from serving.api.truncation import keep_first, keep_last, refuse_over_limit


def rerank(version: str):
    async def handler(request: web.Request) -> web.Response:
        api = api_of(request)
        body = await read_json(request)
        model = api.models.named(body.get("model") if isinstance(body, dict) else None, "rerank")
        parsed = cohere_rerank_request(body, model.limits)
        documents = parsed.documents
        per_doc = body.get("max_tokens_per_doc")
        if per_doc is not None and per_doc < model.max_tokens:
            texts = keep_first(model, [document.decode("utf-8") for document in documents], per_doc)
            documents = [text.encode("utf-8") for text in texts]
        scores = sigmoid(await pair_scores(request, model, parsed.query, documents))
        return answer(cohere_response(scores, parsed, str(uuid.uuid4()), version))

    return handler


def read_as_asked(model: ServedModel, parsed: CohereEmbedRequest) -> list[bytes]:
    """The texts as the model is to read them: the input type's prompt in front, cut as truncate says (END, the
    default, is the stages' own: a text's first max_tokens tokens)."""
    names = INPUT_TYPES.get(parsed.input_type, ())
    prompt = next((model.prompts[name] for name in names if name in model.prompts), None)
    prompt = model.prompt(None) if prompt is None else prompt  # as encode_query() falls back to the default
    if not prompt and parsed.truncate == "END":
        return parsed.texts
    texts = [prompt + data.decode("utf-8") for data in parsed.texts]
    if parsed.truncate == "NONE":
        refuse_over_limit(model, texts, "texts", 400, "truncate is NONE")
    elif parsed.truncate == "START":
        texts = keep_last(model, texts)
    return [text.encode("utf-8") for text in texts]


def embed(version: str):
    async def handler(request: web.Request) -> web.Response:
        api = api_of(request)
        body = await read_json(request)
        model = api.models.named(body.get("model") if isinstance(body, dict) else None, "embedding")
        parsed = cohere_embed_request(body, model.limits, version)
        ranges = model.ranges_for(parsed.embedding_types, "embedding_types", parsed.dimensions)
        texts = read_as_asked(model, parsed)
        context = CURRENT.get()
        if parsed.input_type == "search_query" and context is not None and context.asked_class is None:
            context.asked_class = "query"  # Cohere's callers say which side a text is on: a query waits for no one
        vectors, tokens = await embed_texts(request, model, texts, parsed.dimensions, normalize=True)
        rows = {kind: encoded_rows(vectors, kind, ranges) for kind in parsed.embedding_types}
        return answer(cohere_embed_response(rows, int(tokens.sum()), parsed, str(uuid.uuid4()), version))

    return handler


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v2/rerank", rerank("2"))
    router.add_post("/v1/rerank", rerank("1"))
    router.add_post("/v2/embed", embed("2"))
    router.add_post("/v1/embed", embed("1"))
