"""The API front's request and response shapes: OpenAI's /v1/embeddings and TEI's /embed, /predict, /tokenize.

Parsing checks everything a request says before any text reaches Triton, and names the item at fault:
`input[3] must be a string`, `input[0] has 2000000 bytes; at most 1048576`. Errors carry OpenAI's shape
({"error": {"message", "type", "param", "code"}}) on every route, so one client-side handler reads them all.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

ENCODINGS = ("float", "base64")


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

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


def dimensions(value, limits: Limits) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.output_size:
        raise ApiError(400, f"'dimensions' must be an integer in 1..{limits.output_size}", "dimensions")
    return value


def openai_request(body, model_name: str, limits: Limits) -> EmbeddingsRequest:
    body = _object(body)
    _known_fields(body, {"model", "input", "encoding_format", "dimensions", "user"})
    if "input" not in body:
        raise ApiError(400, "'input' is required", "input")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(
            404, f"the model {model!r} does not exist; this server serves {model_name!r}", "model", "model_not_found"
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ApiError(400, f"'encoding_format' must be one of {', '.join(ENCODINGS)}", "encoding_format")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, "'user' must be a string", "user")
    return EmbeddingsRequest(
        _texts(body["input"], "input", limits), encoding, dimensions(body.get("dimensions"), limits)
    )


def tei_request(body, limits: Limits, fields: frozenset[str]) -> tuple[list[bytes], dict]:
    """TEI's {"inputs": ..., ...}: the texts and the other fields (only those in `fields` are accepted)."""
    body = _object(body)
    _known_fields(body, {"inputs", *fields})
    if "inputs" not in body:
        raise ApiError(400, "'inputs' is required", "inputs")
    for flag in ("normalize", "truncate", "raw_scores", "add_special_tokens"):
        if flag in body and not isinstance(body[flag], bool):
            raise ApiError(400, f"'{flag}' must be true or false", flag)
    if body.get("truncate") is False:
        raise ApiError(400, "texts are always truncated to the model's max_tokens: 'truncate' must be true", "truncate")
    return _texts(body["inputs"], "inputs", limits), body


def shaped(embeddings: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first `dimensions` columns, renormalized to unit length (Matryoshka truncation); or unchanged."""
    if dimensions is not None and dimensions < embeddings.shape[1]:
        embeddings = embeddings[:, :dimensions]
        normalize = True
    if normalize:
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(embeddings, dtype=np.float32)


def openai_response(embeddings: np.ndarray, tokens: np.ndarray, encoding: str, model_name: str) -> dict:
    if encoding == "base64":  # little-endian float32, as the OpenAI SDKs decode it
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in embeddings]
    else:
        rows = list(embeddings)  # numpy rows: orjson writes them as lists of floats
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
