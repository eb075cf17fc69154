"""The API front: the calls embedding and reranking users already make, answered by the served models over gRPC.

    python -m serving.api [--settings FILE ...] [--grpc HOST:PORT] [--port N]

Routes (one aiohttp process; the launcher runs api.workers of them on api.port), by who calls them:

    OpenAI (routes_openai.py)   POST /v1/embeddings (/embeddings), GET /v1/models[/{model}]
    TEI (routes_tei.py)         POST /, /embed, /embed_sparse, /predict, /rerank, /similarity, /tokenize, /decode;
                                GET /info
    Cohere (routes_cohere.py)   POST /v2/rerank, /v1/rerank, /v2/embed, /v1/embed
    ColBERT (routes_multi_vector.py) POST /embed_all (TEI's), /colbert/score
    BGE-M3 (routes_hybrid.py)   POST /encode (BGEM3FlagModel.encode's outputs, those asked, from one pass)
    everyone                    GET /health (the launcher's /ready), /metrics (the server's metrics port)

OpenAI's and Cohere's requests name their model (models.py: 404 naming the served ones); TEI's go to the first
model of the task the route serves. Token counts are the pipeline's `tokens` output: what the model saw,
[CLS] and [SEP] included, after truncation to model.max_tokens. Errors come in OpenAI's shape on every route:
400 naming the item at fault, 401 without the key when BERT_TRITON_API_KEY is set (with a keys file: without a
tenant's key, and 429 with the bucket's Retry-After over the tenant's rates: serving/tenants.py), 404 for another model,
413 for a body over api.max_body_bytes (by its Content-Length, before reading it) or more than api.max_inputs
texts, 429 with Retry-After when this worker has api.max_concurrent_requests in flight or Triton's queue is
full, 503 with Retry-After while the server is not ready, 504 past api.timeout_s. Every answer carries the
request's X-Request-Id and TEI's timing headers (request_context.py); api.cors_allow_origins opens it to
browser pages of those origins (cors.py); with tracing.endpoint set, each request is a span in its caller's
trace, passed on to Triton (serving/tracing.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from common.gpu_board import GpuBoard
from protocol.api_key import HEADER, accepted
from serving.api import routes_cohere, routes_hybrid, routes_multi_vector, routes_openai, routes_tei
from serving.api.cors import PREFLIGHT, cors_headers, is_preflight
from serving.api.models import Models
from serving.api.priority import PRIORITY_HEADER, TIMEOUT_HEADER, budget_s, priority_class
from serving.api.request_context import CURRENT, RequestContext
from serving.api.schema import ApiError
from serving.api.service import API, Api, answer, api_of
from serving.log import configure
from serving.request_id import REQUEST_ID, request_id
from serving.tenant_limits import retry_after
from serving.tracing import request_span, set_attribute
from serving.workers import FrontWorkers
from settings import load_deployment, override_flags
from settings.cores import api_workers

log = logging.getLogger("api")
OPEN_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapes need no key
KEY_REQUIRED = "a valid API key is required: send Authorization: Bearer <key>"


async def health(request: web.Request) -> web.Response:
    api = api_of(request)
    try:
        async with api.session.get(api.ready_url) as response:
            ready = response.status == 200
            reason = (await response.text()).strip()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        ready, reason = False, f"the launcher's {api.ready_url} did not answer ({type(exc).__name__})"
    if not ready:
        raise ApiError(503, f"not ready: {reason}", code="not_ready")
    return answer({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    """The server's metrics port, then this front's texts and requests per Triton call (call_stats.py)."""
    api = api_of(request)
    try:
        async with api.session.get(api.metrics_url) as response:
            server, status = await response.read(), response.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        raise ApiError(503, f"the metrics port {api.metrics_url} did not answer", code="not_ready") from None
    if status != 200:
        return web.Response(body=server, status=status, content_type="text/plain")
    separator = b"" if not server or server.endswith(b"\n") else b"\n"
    own = api.stats.prometheus() + (api.tenants.prometheus() if api.tenants is not None else "")
    return web.Response(body=server + separator + own.encode(), content_type="text/plain")


@web.middleware
async def guard(request: web.Request, handler) -> web.StreamResponse:
    """What every request gets: its id and RequestContext, CORS for allowed origins, the shared checks, and its
    id and timing headers on the answer, whatever it is."""
    api = api_of(request)
    context = RequestContext(request_id(request.headers.get(REQUEST_ID)))
    CURRENT.set(context)
    cors = cors_headers(request.headers.get("Origin"), api.deployment.api.cors_allow_origins)
    if cors and is_preflight(request.method, request.headers):
        return web.Response(status=204, headers={**cors, **PREFLIGHT})
    with request_span(api.tracing, f"{request.method} {request.path[:200]}", request.headers, context.id) as trace:
        context.trace = trace
        response = await checked(request, handler, api, context)
    response.headers.update({**context.headers(), **cors})
    return response


async def checked(request: web.Request, handler, api: Api, context: RequestContext) -> web.StreamResponse:
    """The checks every route shares, in order: key, body size, concurrency; then errors in OpenAI's shape,
    the server's (5xx) logged with the request's id."""
    settings = api.deployment.api
    try:
        if api.tenants is not None and request.path not in OPEN_PATHS:
            admit_tenant(request, api, context)
        elif api.api_key and request.path not in OPEN_PATHS and not accepted(request.headers.get(HEADER), api.api_key):
            raise ApiError(401, KEY_REQUIRED, code="invalid_api_key")
        limit = settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"the body has {request.content_length} bytes; api.max_body_bytes is {limit}")
        context.asked_class = priority_class(request.headers.get(PRIORITY_HEADER))
        context.budget_s = budget_s(request.headers.get(TIMEOUT_HEADER))
        if api.in_flight >= settings.max_concurrent_requests:
            raise ApiError(429, "Model is overloaded: too many requests in flight", code="overloaded")
        api.in_flight += 1
        try:
            return await handler(request)
        finally:
            api.in_flight -= 1
    except ApiError as exc:
        if exc.status >= 500:
            where = f"{request.method} {request.path[:200]!r}"
            extra = {"request_id": context.id, "tenant": context.tenant}
            log.error(f"request {context.id} {where}{tenant_note(context)}: {exc.status} {exc}", extra=extra)
        headers = {"Retry-After": str(exc.retry_after)} if exc.status in (429, 503) else None
        response = answer(exc.body(), exc.status, headers)
        if exc.status == 413:
            response.force_close()  # the body is not read: this connection ends here
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = settings.max_body_bytes
        response = answer(ApiError(413, f"the body passed api.max_body_bytes = {limit} bytes").body(), 413)
        response.force_close()
        return response


def admit_tenant(request: web.Request, api: Api, context: RequestContext) -> None:
    """The tenant of the request's key (serving/tenants.py) into its context and span, its requests/s taken:
    401 for an unknown key, 429 with the bucket's Retry-After over the rate."""
    tenant = api.tenants.identify(request.headers.get(HEADER))
    if tenant is None:
        raise ApiError(401, KEY_REQUIRED, code="invalid_api_key")
    context.tenant, context.max_class = tenant.name, tenant.max_priority
    set_attribute(api.tracing, "tenant", tenant.name)
    wait = api.tenants.admit(tenant)
    if wait:
        message = f"tenant {tenant.name!r} is over its requests_per_s = {tenant.requests_per_s:g}"
        raise ApiError(429, message, code="rate_limit_exceeded", retry_after=retry_after(wait))


def tenant_note(context: RequestContext) -> str:
    """The tenant in a text log line about the request (json lines carry it as a field)."""
    return f" (tenant {context.tenant})" if context.tenant else ""


def make_app(api: Api) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=api.deployment.api.max_body_bytes)
    app[API] = api
    app.cleanup_ctx.append(api.start)
    for routes in (routes_openai, routes_tei, routes_multi_vector, routes_hybrid, routes_cohere):
        routes.add_routes(app.router)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def command(
    settings_paths: tuple[Path, ...] | list[Path],
    repository: Path,
    host: str,
    port: int,
    grpc_target: str,
    ready_url: str,
    metrics_url: str,
    overrides: tuple[str, ...] | list[str] = (),
    gpu_board: Path | None = None,
) -> list[str]:
    """The command line of one worker, as the launcher and the chart's api container run it; overrides: the
    launcher's --set, which the worker applies over the settings files it reads; gpu_board: the server's
    (common/gpu_board.py), where the launcher made one."""
    return [
        "-m", "serving.api", "--settings", *map(str, settings_paths), "--repository", str(repository),
        "--host", host, "--port", str(port), "--grpc", grpc_target, "--ready-url", ready_url,
        "--metrics-url", metrics_url, "--workers", "1", *override_flags(overrides),
        *(["--gpu-board", str(gpu_board)] if gpu_board else []),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.api", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", nargs="+", default=[], help="settings file(s), one per model (default: settings/defaults.toml)"
    )
    parser.add_argument("--repository", type=Path, help="the generated model repository (default: the settings')")
    parser.add_argument("--host", help="default: server.host")
    parser.add_argument("--port", type=int, help="default: api.port")
    parser.add_argument("--grpc", help="tritonserver's gRPC, host:port (default: 127.0.0.1:server.grpc_port)")
    parser.add_argument("--ready-url", help="the launcher's readiness (default: 127.0.0.1:server.health_port)")
    parser.add_argument("--metrics-url", help="default: 127.0.0.1:server.metrics_port/metrics")
    parser.add_argument(
        "--gpu-board",
        type=Path,
        help="the server's GPU board (common/gpu_board.py): queries use the lane only beside ingestion",
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    parser.add_argument(
        "--workers", type=int, default=1, help="processes on the port, each restarted if it dies (0: api.workers = 0's)"
    )
    args = parser.parse_args(argv)
    deployment = load_deployment(args.settings, args.set)
    configure(deployment.server.log_format)
    server = deployment.server
    host, port = args.host or server.host, args.port or deployment.api.port
    count = api_workers(args.workers)
    if count > 1:  # as a container of its own (the chart): this process supervises the workers
        own = argv if argv is not None else sys.argv[1:]
        arguments = ["-m", "serving.api", *own, "--workers", "1"]
        workers = FrontWorkers("API front", arguments, count, host, port).start()
        signal.signal(signal.SIGTERM, lambda *_: workers.stop() or sys.exit(0))
        signal.pause()
        return
    api = Api(
        deployment,
        Models.load(deployment, args.repository or deployment.repository_dir),
        port,
        args.grpc or f"127.0.0.1:{server.grpc_port}",
        args.ready_url or f"http://127.0.0.1:{server.health_port}/ready",
        args.metrics_url or f"http://127.0.0.1:{server.metrics_port}/metrics",
        GpuBoard(args.gpu_board) if args.gpu_board else None,
    )
    web.run_app(
        make_app(api),
        host=host,
        port=port,
        reuse_port=True,
        access_log=None,
        print=None,
        handler_cancellation=True,  # a client gone away leaves the Coalescer's queue
        shutdown_timeout=5,
    )
