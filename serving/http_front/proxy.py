"""The HTTP front: the one process between HTTP clients and tritonserver's own HTTP port.

tritonserver 2.51 parses whatever reaches its HTTP port, and some bodies kill it: one over ~4 MiB sent as
application/x-www-form-urlencoded (what `curl -d` sends) ends it with SIGSEGV, whatever the URL (upstream
server issue 5840). So the launcher binds Triton's HTTP to 127.0.0.1:front.triton_http_port and this front
listens on server.http_port. For each request it

- answers 413 to a body over front.max_body_bytes: by its Content-Length before reading it, or as soon as a
  chunked body passes the bound;
- inflates a gzip or deflate body itself, within the same bound (Triton would inflate it without one), and
  refuses other encodings with 415;
- forwards every body as application/json, or as application/octet-stream when it carries Triton's
  binary-data header, so no form parser runs in Triton; multipart bodies get 415;
- answers 400, not Triton's 500, when an inference request is not JSON of the KServe v2 shape (checked only
  after Triton answered 500, so a good request pays nothing for it);
- answers 503 while tritonserver is down (the launcher starts it again);
- with an API key set (protocol/api_key.py), answers 401 to an inference request without it (Triton's own
  check, which the key restricts its inference group to, would answer 403 with its own wording);
- with a keys file (serving/tenants.py), answers 401 to an inference request without a tenant's key, 403 to
  one for a model's query lane (<model>-query) from a tenant whose max_priority is ingestion, and 429 with
  Retry-After over the tenant's requests/s or texts/s (inputs[0].shape[0], read from the JSON only for a
  tenant with a texts/s limit);
- echoes each request's X-Request-Id (serving/request_id.py: the caller's if plain, else a new one), puts
  it in its log lines about the request and, where an inference request's JSON has no top-level "id", sets
  that to it (Triton takes a request id only there, answers it in the response's "id" and traces with it);
- with tracing on (serving/tracing.py), opens a span per request and passes its context to Triton.

gRPC does not pass here: Triton's gRPC server took 8.3 MB messages without harm. `python -m
serving.http_front` runs one worker; the launcher runs front.workers of them on one port (SO_REUSEPORT)
and starts a dead one again (serving/workers.py FrontWorkers).
"""

from __future__ import annotations

import argparse
import json
import logging
import re

import aiohttp
from aiohttp import web

from protocol.api_key import HEADER, accepted, api_key
from serving.log import LOG_FORMATS, configure
from serving.request_id import REQUEST_ID, request_id
from serving.tenant_limits import retry_after
from serving.tenants import Tenant, Tenants
from serving.tracing import Tracing, request_span, set_attribute
from settings import load_deployment, override_flags
from settings.schema import TracingSettings

log = logging.getLogger("front")
BINARY_HEADER = "Inference-Header-Content-Length"  # Triton's binary tensor data extension
# Not forwarded either way: connection-level headers, and those the front sets itself.
DROPPED = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Expect",
        "Host",
        "Content-Length",
    )
)
# Nor sent on to Triton: the encoding of a body inflated here, and the binary-data header, which is set anew.
REQUEST_DROPPED = DROPPED | {"content-encoding", BINARY_HEADER.lower()}
INFER_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
# Triton's inference group, which a keys file restricts here (Triton then checks no key on its loopback port)
INFERENCE_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/(infer|generate|generate_stream)$")
OBJECT_START = re.compile(rb'\s*\{(?=\s*")')  # a JSON object's opening brace, a key after it
UPSTREAM = web.AppKey("upstream", str)
LIMIT = web.AppKey("limit", int)
SESSION = web.AppKey("session", aiohttp.ClientSession)
KEY = web.AppKey("key", object)  # the API key, or None
TRACING = web.AppKey("tracing", object)  # serving/tracing.py's Tracing, or None
TENANTS = web.AppKey("tenants", object)  # serving/tenants.py's Tenants, or None without a keys file


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error(status: int, message: str) -> web.Response:
    """An error as tritonserver words its own: {"error": "..."}."""
    return web.json_response({"error": message}, status=status)


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(413, f"the body has {request.content_length} bytes; front.max_body_bytes is {limit}")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "deflate"):
        raise BodyError(415, f"Content-Encoding {encoding!r} is not accepted: send gzip, deflate or identity")
    if request.headers.get("Content-Type", "").lower().startswith("multipart/"):
        raise BodyError(415, "multipart bodies are not part of Triton's protocol: send JSON (application/json)")
    try:
        body = await request.read()  # aiohttp inflates gzip and deflate as it reads: the bound holds for that too
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, f"the body passed front.max_body_bytes = {limit} bytes") from None
    return body


def _leaves(data):
    if isinstance(data, list):
        for item in data:
            yield from _leaves(item)
    else:
        yield data


def infer_request_problem(body: bytes, binary_header: str | None) -> str | None:
    """What makes an inference request malformed (not JSON, not the v2 shape, data of the wrong type), or None."""
    if binary_header is not None:
        if not binary_header.isdigit() or int(binary_header) > len(body):
            return f"{BINARY_HEADER} must be the byte length of the JSON header at the start of the body"
        body = body[: int(binary_header)]
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"the body is not JSON ({exc})"
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or not request["inputs"]:
        return "the body must be a JSON object with a non-empty list 'inputs'"
    for index, tensor in enumerate(request["inputs"]):
        if not isinstance(tensor, dict):
            return f"inputs[{index}] must be an object with name, datatype, shape and data"
        for key, kind in (("name", str), ("datatype", str), ("shape", list)):
            if not isinstance(tensor.get(key), kind):
                return f"inputs[{index}].{key} must be a {kind.__name__ if kind is str else 'list'}"
        if "data" not in tensor:
            continue
        datatype = tensor["datatype"]
        for leaf in _leaves(tensor["data"]):
            if datatype == "BYTES":
                good = isinstance(leaf, str)
            elif datatype == "BOOL":
                good = isinstance(leaf, bool)
            else:
                good = isinstance(leaf, int | float) and not isinstance(leaf, bool)
            if not good:
                return f"inputs[{index}].data holds {json.dumps(leaf)[:40]}, which is not of datatype {datatype}"
    return None


def with_request_id(body: bytes, binary_header: str | None, identity: str) -> tuple[bytes, str | None]:
    """The inference body with `identity` as its top-level "id" when it has none, and its binary-data header
    (the JSON's byte length) to send with it; anything that is not plainly a JSON object goes as it came.

    With the binary-data extension the JSON is the first binary_header bytes: the id goes in there too and
    the header grows by as much, so that tritonclient's HTTP requests (the project's client among them) are
    followed as well. The id is spliced in after the opening brace, so a body is copied once and parsed only
    when it mentions "id" somewhere (a text or parameter may, and the caller's own "id" is kept)."""
    if binary_header is not None and not (binary_header.isdigit() and int(binary_header) <= len(body)):
        return body, binary_header  # Triton refuses it; infer_request_problem says why
    end = len(body) if binary_header is None else int(binary_header)
    start = OBJECT_START.match(body, 0, end)
    if start is None:
        return body, binary_header
    if body.find(b'"id"', 0, end) != -1:
        try:
            if "id" in json.loads(body[:end]):
                return body, binary_header
        except ValueError:  # not JSON (nor UTF-8): Triton answers, and infer_request_problem explains
            return body, binary_header
    field = b'"id":"%s",' % identity.encode()  # a plain token (serving/request_id.py): nothing to escape
    spliced = b"".join((body[: start.end()], field, memoryview(body)[start.end() :]))
    return spliced, None if binary_header is None else str(end + len(field))


async def forward(request: web.Request) -> web.Response:
    """The request to tritonserver and its answer back, with the request's id (and span, when tracing)."""
    identity = request_id(request.headers.get(REQUEST_ID))
    name = f"{request.method} {request.path[:200]}"
    with request_span(request.app[TRACING], name, request.headers, identity) as trace:
        response = await _forward(request, identity, trace)
    response.headers[REQUEST_ID] = identity
    return response


def kserve_texts(body: bytes, binary_header: str | None) -> int:
    """inputs[0].shape[0] of a KServe JSON inference request; 1 for what is not plainly such a request (Triton
    refuses it, or it is one text)."""
    try:
        request = json.loads(body[: int(binary_header)] if binary_header is not None else body)
        texts = request["inputs"][0]["shape"][0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return 1
    return texts if type(texts) is int and texts >= 0 else 1


def tenant_refusal(request: web.Request, tenant: Tenant, body: bytes) -> web.Response | None:
    """403 above the tenant's priority ceiling (a query lane's URL), 429 with Retry-After over its rates, or
    None: it may pass."""
    tenants: Tenants = request.app[TENANTS]
    binary_header = request.headers.get(BINARY_HEADER)
    texts = kserve_texts(body, binary_header) if tenants.needs_shape(tenant) else 0
    problem = tenants.priority_problem(tenant, request.path.split("/")[3])  # /v2/models/<model>/...
    if problem:
        return error(403, problem)
    wait = tenants.admit(tenant, 1, texts)
    if not wait:
        return None
    rates = f"requests_per_s = {tenant.requests_per_s:g}, texts_per_s = {tenant.texts_per_s:g}"
    refused = error(429, f"tenant {tenant.name!r} is over its rate ({rates}): retry after Retry-After seconds")
    refused.headers["Retry-After"] = str(retry_after(wait))
    return refused


async def _forward(request: web.Request, identity: str, trace: dict[str, str]) -> web.Response:
    key, tenants = request.app[KEY], request.app[TENANTS]
    tenant = None
    if tenants is not None and INFERENCE_PATH.match(request.path):
        tenant = tenants.identify(request.headers.get(HEADER))
        if tenant is None:
            refused = error(401, "a valid API key is required: send Authorization: Bearer <key>")
            refused.force_close()  # the body is not read
            return refused
        set_attribute(request.app[TRACING], "tenant", tenant.name)
    elif key and INFER_PATH.match(request.path) and not accepted(request.headers.get(HEADER), key):
        refused = error(401, "a valid API key is required: send Authorization: Bearer <key>")
        refused.force_close()  # the body is not read
        return refused
    try:
        body = await read_body(request, request.app[LIMIT])
    except BodyError as exc:
        refused = error(exc.status, str(exc))
        refused.force_close()  # the rest of the body is not read (nor decoded): this connection ends here
        return refused
    if tenant is not None and (refused := tenant_refusal(request, tenant, body)) is not None:
        return refused
    binary_header = request.headers.get(BINARY_HEADER)
    infer = request.method == "POST" and INFER_PATH.match(request.path) is not None
    # Every body without the binary header reaches Triton as JSON, whatever its Content-Type (curl -d sends a
    # form's), so each inference body gets the id.
    sent, sent_header = with_request_id(body, binary_header, identity) if infer else (body, binary_header)
    headers = {name: value for name, value in request.headers.items() if name.lower() not in REQUEST_DROPPED}
    headers.update(trace)  # this front's span as the parent of Triton's
    if sent_header is not None:
        headers[BINARY_HEADER] = sent_header
    if body:
        headers["Content-Type"] = "application/octet-stream" if binary_header is not None else "application/json"
    else:
        headers.pop("Content-Type", None)
    url = request.app[UPSTREAM] + request.raw_path
    try:
        async with request.app[SESSION].request(request.method, url, data=sent, headers=headers) as upstream:
            data = await upstream.read()
    except aiohttp.ClientConnectionError:
        where = f"{request.method} {request.path[:200]!r}" + (f" (tenant {tenant.name})" if tenant else "")
        extra = {"request_id": identity, "tenant": tenant.name if tenant else None}
        log.error(f"request {identity} {where}: 503, tritonserver is not answering", extra=extra)
        return error(503, "tritonserver is not running (the launcher is starting it again): retry shortly")
    status = upstream.status
    if status == 500 and infer:
        problem = infer_request_problem(body, binary_header)  # the caller's body, as the caller sent it
        if problem:
            return error(400, f"{problem}; tritonserver said: {_error_text(data)}")
    response_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED}
    return web.Response(status=status, body=data, headers=response_headers)


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace")


def make_app(
    upstream: str, max_body_bytes: int, tracing: Tracing | None = None, tenants: Tenants | None = None
) -> web.Application:
    """The front's aiohttp application: every path and method goes to tritonserver at upstream (host:port)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[TRACING] = tracing
    app[TENANTS] = tenants
    app[UPSTREAM] = f"http://{upstream}"
    app[LIMIT] = max_body_bytes
    app[KEY] = api_key()

    async def session(app: web.Application):
        # Responses pass through as Triton encoded them (auto_decompress off), so Triton may compress only what
        # the client asked to be compressed: no Accept-Encoding of aiohttp's own. Idle pooled connections close
        # after a second: Triton's shutdown waits for its HTTP connections to go (up to its exit timeout).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=2)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        ) as client:
            app[SESSION] = client
            yield
        if tracing is not None:
            tracing.shutdown()

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{path:.*}", forward)
    return app


def command(
    host: str,
    port: int,
    upstream_port: int,
    max_body_bytes: int,
    log_format: str = "text",
    tracing: TracingSettings | None = None,
    tenants: tuple[list, list, int] | None = None,
) -> list[str]:
    """One worker's command line (after the interpreter), as FrontWorkers runs it; tenants: (settings paths,
    overrides, the server's gRPC port) of a deployment with a keys file, whose tenants it then checks."""
    traced = tracing is not None and tracing.endpoint
    keyed = (
        ["--settings", *map(str, tenants[0]), *override_flags(tenants[1]), "--tenants-scope", str(tenants[2])]
        if tenants
        else []
    )
    return [
        "-m", "serving.http_front", "--host", host, "--port", str(port),
        "--upstream", f"127.0.0.1:{upstream_port}", "--max-body-bytes", str(max_body_bytes),
        "--log-format", log_format,
        *(["--trace-endpoint", tracing.endpoint, "--trace-sample-rate", str(tracing.sample_rate),
           "--trace-service-name", tracing.service_name] if traced else []),
        *(keyed if tenants else []),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.http_front", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="tritonserver's HTTP, host:port")
    parser.add_argument("--max-body-bytes", type=int, required=True)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text", help="server.log_format (serving/log.py)")
    parser.add_argument("--trace-endpoint", default="", help="tracing.endpoint (serving/tracing.py); none: off")
    parser.add_argument("--trace-sample-rate", type=float, default=0.01, help="tracing.sample_rate")
    parser.add_argument("--trace-service-name", default="bert-triton", help="tracing.service_name")
    parser.add_argument("--settings", nargs="*", help="with --tenants-scope: the settings (tenants, priority)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    parser.add_argument("--tenants-scope", type=int, default=0, help="server.grpc_port: tenants' buckets; 0: none")
    args = parser.parse_args(argv)
    configure(args.log_format)
    # Only the front's own spans are its business: whether Triton traces too is the launcher's flag.
    settings = TracingSettings(args.trace_endpoint, args.trace_sample_rate, args.trace_service_name, triton_spans=False)
    deployment = load_deployment(args.settings or [], args.set) if args.tenants_scope else None
    tenants = Tenants.of(deployment, args.tenants_scope, "http") if deployment else None
    app = make_app(args.upstream, args.max_body_bytes, Tracing.of(settings, "front"), tenants)
    # The launcher stops the front after tritonserver: whatever is still in flight then is answered 503 at once.
    web.run_app(app, host=args.host, port=args.port, reuse_port=True, access_log=None, print=None, shutdown_timeout=5)
