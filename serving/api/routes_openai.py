"""OpenAI's routes: POST /v1/embeddings (and /embeddings) and GET /v1/models, the calls the openai SDK and
langchain-openai make. A request names its model; a one-model server answers for its model.name only. With
`chunking` (chunking.py) each data item is one window of a text, or with late chunking one chunk of a window, with
its `text_index` and character `span`."""

from __future__ import annotations

import numpy as np
from aiohttp import web

from common.contract import CHUNK_COUNTS, CHUNK_EMBEDDINGS, CHUNK_TOKENS, TEXT_INPUT, TOKENS_OUTPUT
from serving.api.chunking import Chunking, chunk_spans, document_windows, requested_chunking, window_texts
from serving.api.schema import ApiError, openai_request, openai_response, shaped
from serving.api.service import answer, api_of, read_json


async def embed_texts(request: web.Request, model, encoded: list[bytes], dimensions: int | None, normalize: bool):
    """(embeddings, tokens) of texts already UTF-8, truncated to `dimensions` and renormalized as asked."""
    outputs = await api_of(request).infer(model, {TEXT_INPUT: encoded}, ["embedding"])
    # An already unit-length embedding (the export normalizes) needs renormalizing only when truncated.
    renormalize = normalize and not model.spec.normalize
    return shaped(outputs["embedding"], dimensions, renormalize), outputs[TOKENS_OUTPUT]


Places = list[tuple[int, list[int]]]  # each vector's (text index, [start, end) characters)


async def embed_chunks(request: web.Request, model, texts: list[str], chunking: Chunking, dimensions: int | None,
                       normalize: bool, param: str) -> tuple[np.ndarray, np.ndarray, Places]:  # fmt: skip
    """(vectors, tokens, each vector's (text index, character span)): every window's, or every late chunk's."""
    windows = document_windows(model, texts, chunking.overlap, param)
    encoded = window_texts(texts, windows)
    if chunking.late_tokens is None:
        vectors, tokens = await embed_texts(request, model, encoded, dimensions, normalize)
        return vectors, tokens, [(window.text_index, window.span) for window in windows]
    size = chunking.late_tokens
    outputs = await api_of(request).infer(
        model, {TEXT_INPUT: encoded}, [CHUNK_EMBEDDINGS, CHUNK_COUNTS], {CHUNK_TOKENS: size}
    )
    places = []  # the chunks come packed, window after window (common/contract.py)
    for window, text, count in zip(windows, encoded, outputs[CHUNK_COUNTS].reshape(-1).tolist(), strict=True):
        spans = chunk_spans(model, text.decode("utf-8"), size)
        if len(spans) != count:  # the stage and the front cut the same tokens: never, unless they disagree
            raise ApiError(500, f"the model answered {count} chunks of a window the front cuts into {len(spans)}")
        places += [(window.text_index, [window.start + start, window.start + end]) for start, end in spans]
    renormalize = normalize and not model.spec.normalize
    return shaped(outputs[CHUNK_EMBEDDINGS], dimensions, renormalize), outputs[TOKENS_OUTPUT], places


async def embeddings(request: web.Request) -> web.Response:
    api = api_of(request)
    body = await read_json(request)
    model = api.models.named(body.get("model") if isinstance(body, dict) else None, "embedding")
    parsed = openai_request(body, model.limits)
    ranges = model.ranges_for((parsed.encoding_format,), "encoding_format", parsed.dimensions)
    chunking = requested_chunking(body, model)
    if chunking is None:
        prompt = model.prompt(None).encode("utf-8")  # a model's default prompt, as encode() reads a text
        encoded = [prompt + data for data in parsed.encoded] if prompt else parsed.encoded
        vectors, tokens = await embed_texts(request, model, encoded, parsed.dimensions, normalize=True)
        return answer(openai_response(vectors, tokens, parsed.encoding_format, model.name, ranges))
    texts = [data.decode("utf-8") for data in parsed.encoded]
    vectors, tokens, places = await embed_chunks(request, model, texts, chunking, parsed.dimensions, True, "input")
    response = openai_response(vectors, tokens, parsed.encoding_format, model.name, ranges)
    for item, (text_index, span) in zip(response["data"], places, strict=True):  # `index` stays the item's (SDK)
        item["text_index"], item["span"] = text_index, span
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
