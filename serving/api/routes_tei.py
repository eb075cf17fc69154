"""Hugging Face TEI's routes, the calls its clients make (huggingface_hub's InferenceClient, the integrations
built on it): POST /embed, /embed_sparse, /predict, /rerank, /similarity, /tokenize, /decode, GET /info, and POST /
dispatched
by the first model's task as TEI dispatches it. TEI serves one model and its requests name none: each route
goes to the first served model of its task."""

from __future__ import annotations

import numpy as np
from aiohttp import web

from common.contract import (
    INPUT_TYPE,
    INPUT_TYPES,
    QUERY_INPUT,
    SCORE_OUTPUT,
    SPARSE_INDICES,
    SPARSE_THRESHOLD,
    SPARSE_TOP_K,
    SPARSE_VALUES,
    TEXT_INPUT,
)
from protocol.sparse import entries
from serving.api.chunking import requested_chunking
from serving.api.models import ServedModel
from serving.api.request_context import CURRENT
from serving.api.routes_multi_vector import embed_all
from serving.api.routes_openai import embed_chunks, embed_texts
from serving.api.schema import (
    ApiError,
    dimensions,
    predictions,
    query,
    sigmoid,
    tei_fields,
    tei_ranks,
    tei_request,
    text_list,
)
from serving.api.service import answer, api_of, read_json
from serving.api.truncation import keep_last, refuse_over_limit

EMBED_FIELDS = frozenset({"normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "chunking"})
SPARSE_FIELDS = frozenset({"truncate", "truncation_direction", "prompt_name", "top_k", "threshold", INPUT_TYPE})


def prepared(model: ServedModel, encoded: list[bytes], body: dict, param: str = "inputs") -> list[bytes]:
    """The texts as the model is to read them: its prompt in front (prompt_name, else the model's default prompt),
    cut as truncate and truncation_direction ask (the stages keep a text's first max_tokens tokens)."""
    prompt, direction = model.prompt(body.get("prompt_name")), (body.get("truncation_direction") or "right").lower()
    if not prompt and body.get("truncate") is not False and direction == "right":
        return encoded
    texts = [prompt + data.decode("utf-8") for data in encoded]
    if body.get("truncate") is False:
        refuse_over_limit(model, texts, param)
    elif direction == "left":
        texts = keep_last(model, texts)
    return [text.encode("utf-8") for text in texts]


async def embed(request: web.Request) -> web.Response:
    model = api_of(request).models.for_task("embedding")
    encoded, body = tei_request(await read_json(request), model.limits, EMBED_FIELDS)
    width = dimensions(body.get("dimensions"), model.limits)
    normalize, chunking = body.get("normalize", True), requested_chunking(body, model)
    if chunking is None:
        vectors, _ = await embed_texts(request, model, prepared(model, encoded, body), width, normalize)
        return answer(vectors)
    texts = [data.decode("utf-8") for data in encoded]
    vectors, _, places = await embed_chunks(request, model, texts, chunking, width, normalize, "inputs")
    per_text = [[] for _ in texts]  # with chunking: each text's windows (or late chunks), {"embedding", "span"}
    for vector, (text_index, span) in zip(vectors, places, strict=True):
        per_text[text_index].append({"embedding": vector, "span": span})
    return answer(per_text)


def sparse_parameters(body: dict) -> dict[str, int | float]:
    """The request's top_k, threshold and input_type (ours, beside TEI's fields) as the stage's KServe parameters;
    the settings' [sparse] where it gives none. input_type query: an inference-free model's query side."""
    parameters = {}
    side = body.get(INPUT_TYPE)
    if side is not None:
        if side not in INPUT_TYPES:
            raise ApiError(400, f"'{INPUT_TYPE}' must be one of {', '.join(INPUT_TYPES)}", INPUT_TYPE)
        parameters[INPUT_TYPE] = side
    top_k, threshold = body.get("top_k"), body.get("threshold")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ApiError(400, "'top_k' must be a positive integer", "top_k")
        parameters[SPARSE_TOP_K] = top_k
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 0:
            raise ApiError(400, "'threshold' must be a number >= 0", "threshold")
        parameters[SPARSE_THRESHOLD] = float(threshold)
    return parameters


async def embed_sparse(request: web.Request) -> web.Response:
    """Each text's non-zero vocabulary weights, as TEI answers them: [[{"index", "value"}, ...], ...]."""
    model = api_of(request).models.for_task("sparse")
    encoded, body = tei_request(await read_json(request), model.limits, SPARSE_FIELDS)
    parameters = sparse_parameters(body)
    inputs = {TEXT_INPUT: prepared(model, encoded, body)}
    outputs = await api_of(request).infer(model, inputs, [SPARSE_INDICES, SPARSE_VALUES], parameters or None)
    rows = [zip(indices.tolist(), values.tolist(), strict=True) for indices, values in entries(outputs)]
    return answer([[{"index": i, "value": v} for i, v in row] for row in rows])


async def predict(request: web.Request) -> web.Response:
    model = api_of(request).models.for_task("classification")
    encoded, body = tei_request(await read_json(request), model.limits, frozenset({"truncate", "raw_scores"}))
    if body.get("raw_scores"):
        raise ApiError(400, "the model returns softmax scores only: 'raw_scores' must be false", "raw_scores")
    outputs = await api_of(request).infer(model, {TEXT_INPUT: prepared(model, encoded, body)}, ["scores"])
    ranked = predictions(outputs["scores"], model.spec.labels)
    return answer(ranked[0] if isinstance(body["inputs"], str) else ranked)


async def pair_scores(request: web.Request, model: ServedModel, question: bytes, texts: list[bytes]) -> np.ndarray:
    """The reranker's logit for each (query, text) pair: a query's, whatever the count (a user waits on it)."""
    context = CURRENT.get()
    if context is not None and context.asked_class is None:
        context.asked_class = "query"
    inputs = {QUERY_INPUT: [question] * len(texts), TEXT_INPUT: texts}
    return (await api_of(request).infer(model, inputs, [SCORE_OUTPUT]))[SCORE_OUTPUT].reshape(-1)


async def rerank(request: web.Request) -> web.Response:
    model = api_of(request).models.for_task("rerank")
    fields = frozenset({"texts", "raw_scores", "return_text", "truncate", "truncation_direction"})
    body = tei_fields(await read_json(request), fields, "query")
    if "texts" not in body:
        raise ApiError(400, "'texts' is required", "texts")
    if (body.get("truncation_direction") or "right").lower() != "right":
        raise ApiError(400, "a pair is truncated longest first from the right: 'truncation_direction' must be Right")
    question, texts = query(body["query"], model.limits), text_list(body["texts"], "texts", model.limits)
    if body.get("truncate") is False:
        refuse_over_limit(model, [(question.decode("utf-8"), text.decode("utf-8")) for text in texts], "texts")
    logits = await pair_scores(request, model, question, texts)
    scores = logits if body.get("raw_scores") else sigmoid(logits)
    return answer(tei_ranks(scores, texts, bool(body.get("return_text"))))


async def similarity(request: web.Request) -> web.Response:
    """{"inputs": {"source_sentence", "sentences"}} -> the cosine of each sentence to the source sentence."""
    model = api_of(request).models.for_task("embedding")
    body = tei_fields(
        await read_json(request), frozenset({"truncate", "truncation_direction", "prompt_name"}), "inputs"
    )
    inputs = body["inputs"]
    if not isinstance(inputs, dict) or set(inputs) != {"source_sentence", "sentences"}:
        raise ApiError(400, '\'inputs\' must be {"source_sentence": str, "sentences": [str, ...]}', "inputs")
    source = query(inputs["source_sentence"], model.limits) if isinstance(inputs["source_sentence"], str) else None
    if source is None:
        raise ApiError(400, "'inputs.source_sentence' must be a string", "inputs.source_sentence")
    sentences = text_list(inputs["sentences"], "inputs.sentences", model.limits)
    vectors, _ = await embed_texts(request, model, prepared(model, [source, *sentences], body), None, True)
    return answer((vectors[1:] @ vectors[0]).astype(np.float64))


async def tokenize(request: web.Request) -> web.Response:
    model = api_of(request).models.first
    encoded, body = tei_request(
        await read_json(request), model.limits, frozenset({"add_special_tokens", "prompt_name"})
    )
    texts = [data.decode("utf-8") for data in prepared(model, encoded, body)]
    results = []
    for encoding in model.tokenizer.encode_batch(texts, add_special_tokens=body.get("add_special_tokens", True)):
        results.append(
            [
                {
                    "id": token_id,
                    "text": token,
                    "special": bool(is_special),
                    "start": None if is_special else start,
                    "stop": None if is_special else stop,
                }
                for token_id, token, is_special, (start, stop) in zip(
                    encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
                )
            ]
        )
    return answer(results)


async def decode(request: web.Request) -> web.Response:
    """{"ids": [int, ...] or [[int, ...], ...], "skip_special_tokens"} -> the texts, one per sequence."""
    model = api_of(request).models.first
    body = tei_fields(await read_json(request), frozenset({"skip_special_tokens"}), "ids")
    ids = body["ids"]
    rows = [ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else ids
    vocabulary = model.tokenizer.get_vocab_size()
    if not isinstance(rows, list) or not rows or len(rows) > model.limits.max_inputs:
        raise ApiError(
            400, f"'ids' must be a list of token ids, or of at most {model.limits.max_inputs} such lists", "ids"
        )
    for index, row in enumerate(rows):
        if not isinstance(row, list) or not all(type(i) is int and 0 <= i < vocabulary for i in row):
            raise ApiError(400, f"'ids[{index}]' must be a list of token ids in 0..{vocabulary - 1}", f"ids[{index}]")
    return answer(model.tokenizer.decode_batch(rows, skip_special_tokens=body.get("skip_special_tokens", True)))


def model_info(model: ServedModel) -> dict:
    """TEI's /info of one model."""
    spec = model.spec
    if spec.task == "classification":
        model_type = {"classifier": {"id2label": {str(i): label for i, label in enumerate(spec.labels)}}}
    elif spec.task == "rerank":
        model_type = {"reranker": {"id2label": {"0": "score"}}}
    elif spec.task == "sparse":
        model_type = {"embedding": {"pooling": "splade", "dimensions": spec.output_size}}
    elif spec.task == "multi_vector":  # a vector per kept token: pooled by none
        model_type = {"embedding": {"pooling": "none", "dimensions": spec.output_size}}
    else:
        model_type = {"embedding": {"pooling": spec.pooling, "dimensions": spec.output_size}}
    choice = model.settings.engine_choice()
    return {
        "model_id": model.name,
        "model_dtype": choice.precision,
        "engine": choice.kind,  # ours, beside TEI's fields: which engine the model's stage runs
        "model_type": model_type,
        "max_input_length": model.max_tokens,
        "max_client_batch_size": model.limits.max_inputs,
        "max_batch_bytes": model.max_bytes,
        "prompts": sorted(model.prompts),
    }


async def info(request: web.Request) -> web.Response:
    """The first model's TEI /info, and every served model's under "models"."""
    api = api_of(request)
    described = [model_info(model) for model in api.models.all]
    limit = api.deployment.api.max_concurrent_requests
    return answer({**described[0], "max_concurrent_requests": limit, "models": described})


async def root(request: web.Request) -> web.Response:
    """POST /, as TEI answers it: the first model's task decides (embed, predict, rerank, embed_sparse,
    embed_all; a hybrid model's dense vectors, embed)."""
    handlers = {
        "embedding": embed, "classification": predict, "rerank": rerank, "sparse": embed_sparse,
        "multi_vector": embed_all, "hybrid": embed,
    }  # fmt: skip
    handler = handlers[api_of(request).models.first.task]
    return await handler(request)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/", root)
    router.add_post("/embed", embed)
    router.add_post("/embed_sparse", embed_sparse)
    router.add_post("/predict", predict)
    router.add_post("/rerank", rerank)
    router.add_post("/similarity", similarity)
    router.add_post("/tokenize", tokenize)
    router.add_post("/decode", decode)
    router.add_get("/info", info)
