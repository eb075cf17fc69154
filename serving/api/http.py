"""The API front's HTTP layer: granian (HTTP/1.1 in Rust, its RSGI interface) in the worker's own asyncio loop.

Chosen by measurement (`python -m bench.http_servers`, docs/api.md): serving the front's own JSON work on one
core under wrk, granian cost 53-64 us per request at 64 connections where aiohttp cost 145-166 (uvloop did not
change aiohttp's), so one worker answers 2.5x as many requests. Handlers take a Request and return a Response;
Routes finds them by method and path. A client that goes away cancels its handler, so a request queued in the
Coalescer gives up its place. Several worker processes share one port: granian binds it with SO_REUSEPORT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from serving.api.schema import ApiError


class BodyTooLarge(Exception):
    """A body without Content-Length grew past the limit while it was read."""


class Request:
    """What a handler reads of one HTTP request; `api` is the worker's shared state (service.Api)."""

    def __init__(self, scope, protocol, api, max_body_bytes: int) -> None:
        self.method, self.path, self.headers = scope.method, scope.path, scope.headers  # headers: any case
        self.api, self.match_info = api, {}
        self._protocol, self._limit = protocol, max_body_bytes
        self._body: bytes | None = None

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self) -> bytes:
        """The whole body; one announced by Content-Length was checked against the limit before it was read."""
        if self._body is None:
            if self.content_length is not None:
                self._body = await self._protocol()
            else:  # chunked: count as it comes
                chunks, size = [], 0
                async for chunk in self._protocol:
                    size += len(chunk)
                    if size > self._limit:
                        raise BodyTooLarge
                    chunks.append(chunk)
                self._body = b"".join(chunks)
        return self._body


@dataclass
class Response:
    body: bytes
    status: int = 200
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def force_close(self) -> None:
        """This connection ends with this answer (its body was not read)."""
        self.headers["Connection"] = "close"


Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """Handlers by method and path; a "{name}" segment matches any one segment, into request.match_info."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[tuple[str, ...], dict[str, Handler]]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        if "{" in path:
            segments = tuple(path.strip("/").split("/"))
            for known, methods in self._patterns:
                if known == segments:
                    methods[method] = handler
                    return
            self._patterns.append((segments, {method: handler}))
        else:
            self._exact.setdefault(path, {})[method] = handler

    def add_get(self, path: str, handler: Handler) -> None:
        self.add("GET", path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self.add("POST", path, handler)

    def find(self, request: Request) -> Handler:
        """The handler of the request's method and path (its match_info filled in); 404 or 405 naming them."""
        methods = self._exact.get(request.path)
        if methods is None:
            segments = request.path.strip("/").split("/")
            for pattern, candidates in self._patterns:
                if len(pattern) == len(segments) and all(
                    want == have or want.startswith("{") for want, have in zip(pattern, segments, strict=True)
                ):
                    request.match_info = {
                        want[1:-1]: have for want, have in zip(pattern, segments, strict=True) if want.startswith("{")
                    }
                    methods = candidates
                    break
        if methods is None:
            raise ApiError(404, f"no route {request.path[:200]!r} here", code="not_found")
        handler = methods.get(request.method) or (methods.get("GET") if request.method == "HEAD" else None)
        if handler is None:
            allowed = ", ".join(sorted(methods))
            raise ApiError(405, f"{request.method} is not served on {request.path[:200]!r}: use {allowed}")
        return handler


class RsgiApp:
    """The RSGI application granian calls per request: `answer` (the front's guard) makes the Response."""

    def __init__(self, api, answer: Callable[[Request], Awaitable[Response]], max_body_bytes: int) -> None:
        self.api, self.answer, self.max_body_bytes = api, answer, max_body_bytes

    async def __rsgi__(self, scope, protocol) -> None:
        if scope.proto != "http":  # websockets: not served
            return
        request = Request(scope, protocol, self.api, self.max_body_bytes)
        handler = asyncio.current_task()
        departure = asyncio.ensure_future(protocol.client_disconnect())
        departure.add_done_callback(lambda gone: gone.cancelled() or handler.cancel())
        try:
            response = await self.answer(request)
        except asyncio.CancelledError:  # the client went away: nobody to answer
            return
        finally:
            departure.cancel()
        headers = [("content-type", response.content_type), *response.headers.items()]
        protocol.response_bytes(response.status, headers, response.body)


async def serve(app: RsgiApp, host: str, port: int, stopping: asyncio.Event) -> None:
    """Serve `app` on host:port in this loop until `stopping` is set, then finish the requests in flight."""
    # granian's lines go to this process's logging (serving/log.py formats them); no access log
    ours = {"loggers": {"_granian": {"propagate": True}, "granian.access": {"propagate": False}}}
    server = Server(
        app, address=host, port=port, interface=Interfaces.RSGI, http=HTTPModes.http1, runtime_threads=1,
        log_level=LogLevels.warning, log_dictconfig=ours, log_access=False, websockets=False,
    )  # fmt: skip
    serving = asyncio.create_task(server.serve())
    stopped = asyncio.create_task(stopping.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.stop()
    await serving
