"""The API front: the calls embedding users already make, answered by the ensemble over gRPC.

    python -m serving.api [--settings FILE] [--grpc HOST:PORT] [--port N]

Routes (one aiohttp process; the launcher runs api.workers of them on api.port):

    POST /v1/embeddings   OpenAI: model, input (string or list), encoding_format float|base64, dimensions, user
    GET  /v1/models       OpenAI: the one model served, by the settings' model.name
    POST /embed           TEI: {"inputs", "normalize", "truncate", "dimensions"} -> [[float, ...], ...]
    POST /predict         TEI, classification models: {"inputs"} -> [{"label", "score"}, ...] per text
    POST /tokenize        TEI: {"inputs", "add_special_tokens"} -> [[{"id", "text", "special", "start", "stop"}]]
    GET  /info            TEI: model, task, limits
    GET  /health          200 when the launcher says ready (its /ready: Triton ready and every stub alive), else 503
    GET  /metrics         the server's metrics port, passed through

Token counts (usage.prompt_tokens) are the ensemble's `tokens` output: what the model saw, [CLS] and [SEP]
included, after truncation to model.max_tokens. Errors come in OpenAI's shape on every route: 400 naming
the item at fault, 401 without the key when BERT_TRITON_API_KEY is set, 404 for another model, 413 for a
body over api.max_body_bytes (by its Content-Length, before reading it) or more than api.max_inputs texts,
429 with Retry-After when this worker has api.max_concurrent_requests in flight or Triton's queue is full,
503 with Retry-After while the server is not ready, 504 past api.timeout_s.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from common.contract import SERVING_FILE, TOKENS_OUTPUT, ServingSpec
from common.hf_tokenizer import load_tokenizer
from serving.api.schema import (
    ApiError,
    Limits,
    dimensions,
    openai_request,
    openai_response,
    predictions,
    shaped,
    tei_request,
)
from serving.api.triton_link import BadInput, NotReady, Overloaded, TimedOut, TritonError, TritonLink
from serving.workers import FrontWorkers
from settings import Settings, load_settings

API_KEY_ENV = "BERT_TRITON_API_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapes need no key
API = web.AppKey("api", object)


def model_folder(repository: Path) -> Path:
    """The version folder holding serving.json and tokenizer.json (the one-stage model or the tokenizer)."""
    for folder in sorted(repository.glob("*/1")):
        if (folder / SERVING_FILE).is_file() and (folder / "tokenizer.json").is_file():
            return folder
    raise SystemExit(f"no model in {repository} has {SERVING_FILE} and tokenizer.json: run `make repo` first")


class Api:
    """What every route shares in one worker process."""

    def __init__(self, settings: Settings, folder: Path, grpc_target: str, ready_url: str, metrics_url: str):
        self.settings, self.spec = settings, ServingSpec.load(folder)
        self.tokenizer = load_tokenizer(folder / "tokenizer.json", settings.model.max_tokens)
        self.limits = Limits(settings.api.max_inputs, settings.tokenizer.max_text_bytes, self.spec.output_size)
        self.grpc_target, self.ready_url, self.metrics_url = grpc_target, ready_url, metrics_url
        self.api_key = os.environ.get(API_KEY_ENV) or None
        self.in_flight = 0
        self.created = int(time.time())
        self.link: TritonLink | None = None
        self.session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        return self.settings.model.name

    async def start(self, app: web.Application):
        api = self.settings.api
        self.link = TritonLink(
            self.grpc_target,
            api.grpc_channels,
            self.settings.ensemble.max_batch_size,
            self.settings.tokenizer.max_request_bytes,
            api.timeout_s,
        )
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        yield
        await self.link.close()
        await self.session.close()

    async def infer(self, encoded: list[bytes], outputs: list[str]) -> dict:
        try:
            return await self.link.infer(encoded, [*outputs, TOKENS_OUTPUT])
        except BadInput as exc:
            raise ApiError(400, f"tritonserver refused the texts: {exc}", "input") from None
        except Overloaded as exc:
            raise ApiError(429, f"Model is overloaded: {exc}", code="overloaded") from None
        except NotReady as exc:
            raise ApiError(503, f"tritonserver is not ready: {exc}", code="not_ready") from None
        except TimedOut:
            raise ApiError(504, f"no answer within api.timeout_s = {self.settings.api.timeout_s} s") from None
        except TritonError as exc:
            raise ApiError(500, f"tritonserver failed: {exc}") from None

    async def embed(self, encoded: list[bytes], dimensions: int | None, normalize: bool):
        if self.spec.task != "embedding":
            raise ApiError(400, f"{self.name} is a classification model: use POST /predict", "model")
        outputs = await self.infer(encoded, ["embedding"])
        # An already unit-length embedding (the export normalizes) needs renormalizing only when truncated.
        renormalize = normalize and not self.spec.normalize
        return shaped(outputs["embedding"], dimensions, renormalize), outputs[TOKENS_OUTPUT]


async def _json(request: web.Request):
    body = await request.read()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:  # JSON that orjson refuses but Python reads: a lone surrogate (\ud800), which _texts then names
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON ({exc})") from None


def _answer(data, status: int = 200, headers: dict | None = None) -> web.Response:
    body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


async def embeddings(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    parsed = openai_request(await _json(request), api.name, api.limits)
    vectors, tokens = await api.embed(parsed.encoded, parsed.dimensions, normalize=True)  # as OpenAI's are
    return _answer(openai_response(vectors, tokens, parsed.encoding_format, api.name))


async def models(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    model = {"id": api.name, "object": "model", "created": api.created, "owned_by": "bert-triton"}
    if "model" in request.match_info:
        if request.match_info["model"] != api.name:
            message = f"the model {request.match_info['model']!r} does not exist; this server serves {api.name!r}"
            raise ApiError(404, message, "model", "model_not_found")
        return _answer(model)
    return _answer({"object": "list", "data": [model]})


async def embed(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    encoded, body = tei_request(await _json(request), api.limits, frozenset({"normalize", "truncate", "dimensions"}))
    vectors, _ = await api.embed(encoded, dimensions(body.get("dimensions"), api.limits), body.get("normalize", True))
    return _answer(vectors)


async def predict(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    encoded, body = tei_request(await _json(request), api.limits, frozenset({"truncate", "raw_scores"}))
    if api.spec.task != "classification":
        raise ApiError(400, f"{api.name} is an embedding model: use POST /embed or /v1/embeddings")
    if body.get("raw_scores"):
        raise ApiError(400, "the model returns softmax scores only: 'raw_scores' must be false", "raw_scores")
    outputs = await api.infer(encoded, ["scores"])
    ranked = predictions(outputs["scores"], api.spec.labels)
    return _answer(ranked[0] if isinstance(body["inputs"], str) else ranked)


async def tokenize(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    encoded, body = tei_request(await _json(request), api.limits, frozenset({"add_special_tokens"}))
    texts = [data.decode("utf-8") for data in encoded]
    results = []
    for encoding in api.tokenizer.encode_batch(texts, add_special_tokens=body.get("add_special_tokens", True)):
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
    return _answer(results)


async def info(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    settings = api.settings
    model_type = (
        {"classifier": {"id2label": dict(enumerate(api.spec.labels))}}
        if api.spec.task == "classification"
        else {"embedding": {"pooling": api.spec.pooling, "dimensions": api.spec.output_size}}
    )
    return _answer(
        {
            "model_id": api.name,
            "model_dtype": settings.engine.precision,
            "model_type": model_type,
            "max_input_length": settings.model.max_tokens,
            "max_client_batch_size": settings.api.max_inputs,
            "max_concurrent_requests": settings.api.max_concurrent_requests,
            "max_batch_bytes": settings.tokenizer.max_request_bytes,
        }
    )


async def health(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    try:
        async with api.session.get(api.ready_url) as answer:
            ready = answer.status == 200
            reason = (await answer.text()).strip()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        ready, reason = False, f"the launcher's {api.ready_url} did not answer ({type(exc).__name__})"
    if not ready:
        raise ApiError(503, f"not ready: {reason}", code="not_ready")
    return _answer({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    api: Api = request.app[API]
    try:
        async with api.session.get(api.metrics_url) as answer:
            return web.Response(body=await answer.read(), status=answer.status, content_type="text/plain")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        raise ApiError(503, f"the metrics port {api.metrics_url} did not answer", code="not_ready") from None


@web.middleware
async def guard(request: web.Request, handler) -> web.StreamResponse:
    """The checks every route shares, in order: key, body size, concurrency; then errors in OpenAI's shape."""
    api: Api = request.app[API]
    try:
        if api.api_key and request.path not in OPEN_PATHS:
            scheme, _, key = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api.api_key.encode()):
                raise ApiError(
                    401, "a valid API key is required: send Authorization: Bearer <key>", code="invalid_api_key"
                )
        limit = api.settings.api.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"the body has {request.content_length} bytes; api.max_body_bytes is {limit}")
        if api.in_flight >= api.settings.api.max_concurrent_requests:
            raise ApiError(429, "Model is overloaded: too many requests in flight", code="overloaded")
        api.in_flight += 1
        try:
            return await handler(request)
        finally:
            api.in_flight -= 1
    except ApiError as exc:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        response = _answer(exc.body(), exc.status, headers)
        if exc.status == 413:
            response.force_close()  # the body is not read: this connection ends here
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = api.settings.api.max_body_bytes
        response = _answer(ApiError(413, f"the body passed api.max_body_bytes = {limit} bytes").body(), 413)
        response.force_close()
        return response


def make_app(api: Api) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=api.settings.api.max_body_bytes)
    app[API] = api
    app.cleanup_ctx.append(api.start)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model}", models)
    app.router.add_post("/embed", embed)
    app.router.add_post("/predict", predict)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def command(
    settings_path: Path, repository: Path, host: str, port: int, grpc_target: str, ready_url: str, metrics_url: str
) -> list[str]:
    """The command line of one worker, as the launcher and the chart's api container run it."""
    return [
        "-m", "serving.api", "--settings", str(settings_path), "--repository", str(repository),
        "--host", host, "--port", str(port), "--grpc", grpc_target, "--ready-url", ready_url,
        "--metrics-url", metrics_url, "--workers", "1",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--repository", type=Path, help="the generated model repository (default: the settings')")
    parser.add_argument("--host", help="default: server.host")
    parser.add_argument("--port", type=int, help="default: api.port")
    parser.add_argument("--grpc", help="tritonserver's gRPC, host:port (default: 127.0.0.1:server.grpc_port)")
    parser.add_argument("--ready-url", help="the launcher's readiness (default: 127.0.0.1:server.health_port)")
    parser.add_argument("--metrics-url", help="default: 127.0.0.1:server.metrics_port/metrics")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    parser.add_argument("--workers", type=int, default=1, help="processes on the port, each started again if it dies")
    args = parser.parse_args(argv)
    settings = load_settings(args.settings, args.set)
    server = settings.server
    host, port = args.host or server.host, args.port or settings.api.port
    if args.workers > 1:  # as a container of its own (the chart): this process supervises the workers
        arguments = [
            "-m",
            "serving.api",
            *(argv if argv is not None else sys.argv[1:]),
            "--workers",
            "1",
        ]
        workers = FrontWorkers("API front", arguments, args.workers, host, port).start()
        signal.signal(signal.SIGTERM, lambda *_: workers.stop() or sys.exit(0))
        signal.pause()
        return
    api = Api(
        settings,
        model_folder(args.repository or settings.repository_dir),
        args.grpc or f"127.0.0.1:{server.grpc_port}",
        args.ready_url or f"http://127.0.0.1:{server.health_port}/ready",
        args.metrics_url or f"http://127.0.0.1:{server.metrics_port}/metrics",
    )
    web.run_app(
        make_app(api),
        host=host,
        port=port,
        reuse_port=True,
        access_log=None,
        print=None,
        shutdown_timeout=5,
    )
