"""The API front's request and response shapes: OpenAI's /v1/embeddings, TEI's routes, Cohere's rerank and embed.

Parsing checks everything a request says before any text reaches Triton, and names the item at fault:
`input[3] must be a string`, `input[0] has 2000000 bytes; at most 1048576`. Errors carry OpenAI's shape
({"error": {"message", "type", "param", "code"}}) on every route, so one client-side handler reads them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.api.quantization import FLOATS, QUANTIZED, encoded_rows

# OpenAI's own two (base64: float32 bytes), then the quantized ones, answered as lists of ints.
ENCODINGS = (*FLOATS, *QUANTIZED)


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, retry_after: int = 1
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after  # the Retry-After (whole seconds) of a 429 or 503

    @property
    def kind(self) -> str:
        return {401: "authentication_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    max_inputs: int  # texts per request
    max_text_bytes: int  # UTF-8 bytes per text (tokenizer.max_text_bytes: Triton would refuse it too)
    output_size: int  # embedding width: the largest `dimensions`


@dataclass(frozen=True)
class EmbeddingsRequest:
    encoded: list[bytes]  # each text's UTF-8
    encoding_format: str
    dimensions: int | None


def _texts(value, param: str, limits: Limits) -> list[bytes]:
    """A string or a non-empty list of strings, each UTF-8 within the text limit."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise ApiError(400, f"'{param}' must be a string or a non-empty list of strings", param)
    if len(texts) > limits.max_inputs:
        raise ApiError(413, f"'{param}' has {len(texts)} items; at most {limits.max_inputs} per request", param)
    encoded = []
    for index, text in enumerate(texts):
        where = param if isinstance(value, str) else f"{param}[{index}]"
        if not isinstance(text, str):
            token_ids = isinstance(text, list) or all(isinstance(item, int) for item in texts)  # OpenAI's other form
            kind = "token ids are not accepted: send text" if token_ids else "must be a string"
            raise ApiError(400, f"'{where}' {kind}", where)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError(400, f"'{where}' is not valid Unicode ({exc.reason})", where) from None
        if len(data) > limits.max_text_bytes:
            raise ApiError(400, f"'{where}' has {len(data)} bytes of UTF-8; at most {limits.max_text_bytes}", where)
        encoded.append(data)
    return encoded


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _known_fields(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unknown fields: {', '.join(unknown)}", unknown[0])


def dimensions(value, limits: Limits, param: str = "dimensions") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.output_size:
        raise ApiError(400, f"'{param}' must be an integer in 1..{limits.output_size}", param)
    return value


def openai_request(body, limits: Limits) -> EmbeddingsRequest:
    """OpenAI's embeddings request (which model it names is models.Models.named's to check)."""
    body = _object(body)
    _known_fields(body, {"model", "input", "encoding_format", "dimensions", "user", "chunking"})
    if "input" not in body:
        raise ApiError(400, "'input' is required", "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ApiError(400, f"'encoding_format' must be one of {', '.join(ENCODINGS)}", "encoding_format")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, "'user' must be a string", "user")
    return EmbeddingsRequest(
        _texts(body["input"], "input", limits), encoding, dimensions(body.get("dimensions"), limits)
    )


FLAGS = ("normalize", "truncate", "raw_scores", "return_text", "add_special_tokens", "skip_special_tokens")
DIRECTIONS = ("right", "left")


def tei_fields(body, fields: frozenset[str], required: str) -> dict:
    """A TEI body's fields, only those in `fields` accepted, `required` present, flags boolean, the truncation
    direction Right or Left (any case: huggingface_hub sends it in lower case) and the prompt name a string."""
    body = _object(body)
    _known_fields(body, {required, *fields})
    if required not in body:
        raise ApiError(400, f"'{required}' is required", required)
    for flag in FLAGS:
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            raise ApiError(400, f"'{flag}' must be true or false", flag)
    direction = body.get("truncation_direction")
    if direction is not None and (not isinstance(direction, str) or direction.lower() not in DIRECTIONS):
        raise ApiError(400, "'truncation_direction' must be Right or Left", "truncation_direction")
    if body.get("prompt_name") is not None and not isinstance(body["prompt_name"], str):
        raise ApiError(400, "'prompt_name' must be a string", "prompt_name")
    return body


def tei_request(body, limits: Limits, fields: frozenset[str]) -> tuple[list[bytes], dict]:
    """TEI's {"inputs": ..., ...}: the texts and the other fields (only those in `fields` are accepted)."""
    body = tei_fields(body, fields, "inputs")
    return _texts(body["inputs"], "inputs", limits), body


def text_list(value, param: str, limits: Limits) -> list[bytes]:
    """A non-empty list of strings (a reranker's texts or documents), each UTF-8 within the text limit."""
    if not isinstance(value, list):
        raise ApiError(400, f"'{param}' must be a non-empty list of strings", param)
    return _texts(value, param, limits)


def query(value, limits: Limits) -> bytes:
    if not isinstance(value, str):
        raise ApiError(400, "'query' must be a string", "query")
    return _texts(value, "query", limits)[0]


@dataclass(frozen=True)
class RerankRequest:
    """Cohere's rerank (v1 and v2): documents as strings (v1: or {"text"}), the answer cut to top_n."""

    model: str | None
    query: bytes
    documents: list[bytes]
    top_n: int | None
    return_documents: bool


def cohere_rerank_request(body, limits: Limits) -> RerankRequest:
    body = _object(body)
    _known_fields(body, {"model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc", "priority"})
    for required in ("query", "documents"):
        if required not in body:
            raise ApiError(400, f"'{required}' is required", required)
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise ApiError(400, "'model' must be a string", "model")
    documents = body["documents"]
    if isinstance(documents, list):  # v1 also takes {"text": ...} objects
        documents = [doc["text"] if isinstance(doc, dict) and set(doc) == {"text"} else doc for doc in documents]
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ApiError(400, "'top_n' must be a positive integer", "top_n")
    per_doc = body.get("max_tokens_per_doc")
    if per_doc is not None and (isinstance(per_doc, bool) or not isinstance(per_doc, int) or per_doc < 1):
        raise ApiError(400, "'max_tokens_per_doc' must be a positive integer", "max_tokens_per_doc")
    if body.get("return_documents") is not None and not isinstance(body["return_documents"], bool):
        raise ApiError(400, "'return_documents' must be true or false", "return_documents")
    return RerankRequest(
        body.get("model"),
        query(body["query"], limits),
        text_list(documents, "documents", limits),
        top_n,
        bool(body.get("return_documents")),
    )


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


def ranked(scores: np.ndarray) -> np.ndarray:
    """Indices by score, highest first (ties in the order given)."""
    return np.argsort(-scores, kind="stable")


def tei_ranks(scores: np.ndarray, texts: list[bytes], return_text: bool) -> list[dict]:
    """TEI's /rerank answer: every text by score, highest first, each {index, score[, text]}."""
    ranks = []
    for index in ranked(scores):
        rank = {"index": int(index), "score": float(scores[index])}
        if return_text:
            rank["text"] = texts[index].decode("utf-8")
        ranks.append(rank)
    return ranks


def cohere_response(scores: np.ndarray, request: RerankRequest, request_id: str, version: str) -> dict:
    results = []
    for index in ranked(scores)[: request.top_n]:
        result = {"index": int(index), "relevance_score": float(scores[index])}
        if request.return_documents:
            result["document"] = {"text": request.documents[index].decode("utf-8")}
        results.append(result)
    meta = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    return {"id": request_id, "results": results, "meta": meta}


# Cohere's input types, each read as the first of these sentence-transformers prompts the checkpoint has (none:
# the text as it is); "image" and images are another model's.
INPUT_TYPES = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
TRUNCATIONS = ("NONE", "START", "END")  # refuse a text over the limit, keep its end, keep its start (the default)
COHERE_EMBED_FIELDS = {
    "model", "texts", "images", "inputs", "input_type", "embedding_types", "truncate", "output_dimension",
    "max_tokens", "priority",
}  # fmt: skip


@dataclass(frozen=True)
class CohereEmbedRequest:
    """Cohere's embed (v1 and v2): the texts, how to read them and which embeddings to answer."""

    texts: list[bytes]
    input_type: str | None
    embedding_types: tuple[str, ...]
    by_type: bool  # v2 always; v1 when embedding_types is given (else v1's embeddings_floats answer)
    truncate: str
    dimensions: int | None


def cohere_embed_request(body, limits: Limits, version: str) -> CohereEmbedRequest:
    body = _object(body)
    _known_fields(body, COHERE_EMBED_FIELDS)
    for other in ("images", "inputs"):
        if body.get(other) is not None:
            raise ApiError(400, f"'{other}' is not supported: this server embeds text only; send 'texts'", other)
    if body.get("max_tokens") is not None:
        message = "'max_tokens' is not supported: texts are cut to the model's limit as 'truncate' says"
        raise ApiError(400, message, "max_tokens")
    if body.get("texts") is None:
        raise ApiError(400, "'texts' is required", "texts")
    input_type = body.get("input_type")
    if input_type is not None and (not isinstance(input_type, str) or input_type not in INPUT_TYPES):
        raise ApiError(400, f"'input_type' must be one of {', '.join(INPUT_TYPES)}", "input_type")
    allowed = (*FLOATS, *QUANTIZED) if version == "2" else ("float", *QUANTIZED)  # v1 documents no base64
    kinds = body.get("embedding_types")
    if kinds is not None:
        if not isinstance(kinds, list) or not kinds:
            raise ApiError(
                400, f"'embedding_types' must be a non-empty list of {', '.join(allowed)}", "embedding_types"
            )
        for index, kind in enumerate(kinds):
            if kind not in allowed:
                where = f"embedding_types[{index}]"
                raise ApiError(400, f"'{where}' {kind!r} is not one of {', '.join(allowed)}", where)
    truncate = "END" if body.get("truncate") is None else body["truncate"]
    if not isinstance(truncate, str) or truncate.upper() not in TRUNCATIONS:
        raise ApiError(400, f"'truncate' must be one of {', '.join(TRUNCATIONS)}", "truncate")
    return CohereEmbedRequest(
        text_list(body["texts"], "texts", limits),
        input_type,
        tuple(dict.fromkeys(kinds or ["float"])),
        version == "2" or kinds is not None,
        truncate.upper(),
        dimensions(body.get("output_dimension"), limits, "output_dimension"),
    )


def cohere_embed_response(
    rows: dict[str, list], tokens: int, request: CohereEmbedRequest, request_id: str, version: str
) -> dict:
    """v2's answer, and v1's embeddings_by_type; v1 without embedding_types: embeddings_floats, a list of rows."""
    meta = {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}
    kind = "embeddings_by_type" if request.by_type else "embeddings_floats"
    embeddings = rows if request.by_type else rows["float"]
    texts = [text.decode("utf-8") for text in request.texts]
    return {"response_type": kind, "id": request_id, "embeddings": embeddings, "texts": texts, "meta": meta}


def shaped(embeddings: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first `dimensions` columns, renormalized to unit length (Matryoshka truncation); or unchanged."""
    if dimensions is not None and dimensions < embeddings.shape[1]:
        embeddings = embeddings[:, :dimensions]
        normalize = True
    if normalize:
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(embeddings, dtype=np.float32)


def openai_response(
    embeddings: np.ndarray, tokens: np.ndarray, encoding: str, model_name: str, ranges: np.ndarray | None = None
) -> dict:
    rows = encoded_rows(embeddings, encoding, ranges)
    count = int(tokens.sum())
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": row} for index, row in enumerate(rows)],
        "model": model_name,
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }


def predictions(scores: np.ndarray, labels: tuple[str, ...]) -> list[list[dict]]:
    """TEI's /predict answer per text: every label with its score, highest first."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return [
        [{"score": float(row[i]), "label": labels[i]} for i in ranks] for row, ranks in zip(scores, order, strict=True)
    ]
