"""OpenAI's routes: POST /v1/embeddings (and /embeddings) and GET /v1/models, the calls the openai SDK and
langchain-openai make. A request names its model; a one-model server answers for its model.name only. With
`chunking` (chunking.py) each data item is one window of a text, with its `text_index` and character `span`."""

from __future__ import annotations

from aiohttp import web

from common.contract import TEXT_INPUT, TOKENS_OUTPUT
from serving.api.chunking import document_windows, requested_overlap, window_texts
from serving.api.schema import ApiError, openai_request, openai_response, shaped
from serving.api.service import answer, api_of, read_json


async def embed_texts(request: web.Request, model, encoded: list[bytes], dimensions: int | None, normalize: bool):
    """(embeddings, tokens) of texts already UTF-8, truncated to `dimensions` and renormalized as asked."""
    outputs = await api_of(request).infer(model, {TEXT_INPUT: encoded}, ["embedding"])
    # An already unit-length embedding (the export normalizes) needs renormalizing only when truncated.
    renormalize = normalize and not model.spec.normalize
    return shaped(outputs["embedding"], dimensions, renormalize), outputs[TOKENS_OUTPUT]


async def embeddings(request: web.Request) -> web.Response:
    api = api_of(request)
    body = await read_json(request)
    model = api.models.named(body.get("model") if isinstance(body, dict) else None, "embedding")
    parsed = openai_request(body, model.limits)
    ranges = model.ranges_for((parsed.encoding_format,), "encoding_format", parsed.dimensions)
    overlap = requested_overlap(body, model)
    if overlap is None:
        vectors, tokens = await embed_texts(request, model, parsed.encoded, parsed.dimensions, normalize=True)
        return answer(openai_response(vectors, tokens, parsed.encoding_format, model.name, ranges))
    texts = [data.decode("utf-8") for data in parsed.encoded]
    windows = document_windows(model, texts, overlap, "input")
    vectors, tokens = await embed_texts(request, model, window_texts(texts, windows), parsed.dimensions, True)
    response = openai_response(vectors, tokens, parsed.encoding_format, model.name, ranges)
    for item, window in zip(response["data"], windows, strict=True):  # `index` stays the item's, as the SDK reads it
        item["text_index"], item["span"] = window.text_index, window.span
    return answer(response)


async def models(request: web.Request) -> web.Response:
    api = api_of(request)
    listed = [
        {"id": model.name, "object": "model", "created": api.created, "owned_by": "bert-triton"}
        for model in api.models.all
    ]
    if "model" in request.match_info:
        name = request.match_info["model"]
        found = [entry for entry in listed if entry["id"] == name]
        if not found:
            served = ", ".join(repr(entry["id"]) for entry in listed)
            raise ApiError(
                404, f"the model {name!r} does not exist; this server serves {served}", "model", "model_not_found"
            )
        return answer(found[0])
    return answer({"object": "list", "data": listed})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/embeddings", embeddings)
    router.add_post("/embeddings", embeddings)
    router.add_get("/v1/models", models)
    router.add_get("/v1/models/{model}", models)
