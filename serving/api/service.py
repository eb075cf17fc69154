"""What every route of the API front shares in one worker: the served models, the gRPC link to Triton with a
Coalescer per model (and Triton's refusals worded for the caller), the call statistics, and reading and
writing JSON."""

from __future__ import annotations

import json
import time

import aiohttp
import orjson
from aiohttp import web

from common.contract import TOKENS_OUTPUT
from protocol.api_key import api_key
from serving.api.call_stats import CallStats
from serving.api.coalescer import Coalescer
from serving.api.models import Models, ServedModel
from serving.api.request_context import CURRENT
from serving.api.schema import ApiError
from serving.api.triton_link import BadInput, NotReady, Overloaded, TimedOut, TritonError, TritonLink
from serving.tracing import Tracing
from settings import Deployment

API = web.AppKey("api", object)


class Api:
    """What every route shares in one worker process."""

    def __init__(
        self, deployment: Deployment, models: Models, port: int, grpc_target: str, ready_url: str, metrics_url: str
    ):
        self.deployment, self.models = deployment, models
        self.grpc_target, self.ready_url, self.metrics_url = grpc_target, ready_url, metrics_url
        self.api_key = api_key()
        self.in_flight = 0
        self.created = int(time.time())
        self.stats = CallStats(port, [model.triton for model in models.all])
        self.tracing = Tracing.of(deployment.tracing, "api")
        self.link: TritonLink | None = None
        self.session: aiohttp.ClientSession | None = None
        self._coalescers: dict[tuple[str, tuple[str, ...]], Coalescer] = {}

    async def start(self, app: web.Application):
        settings = self.deployment.api
        self.link = TritonLink(self.grpc_target, settings.grpc_channels, settings.timeout_s, self.stats, self.api_key)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        yield
        await self.link.close()
        await self.session.close()
        if self.tracing is not None:
            self.tracing.shutdown()

    def coalescer(self, model: ServedModel, outputs: tuple[str, ...]) -> Coalescer:
        key = (model.triton, outputs)
        if key not in self._coalescers:
            settings = self.deployment.api
            self._coalescers[key] = Coalescer(
                self.link, model.triton, list(outputs), model.max_texts, model.max_bytes,
                settings.coalesce_calls, settings.coalesce_window_ms / 1000,
            )  # fmt: skip
        return self._coalescers[key]

    async def infer(
        self, model: ServedModel, inputs: dict[str, list[bytes]], outputs: list[str], parameters: dict | None = None
    ) -> dict:
        """The model's outputs and each row's token count, Triton's refusals worded for the caller; `parameters`:
        KServe request parameters (such a request is a call of its own)."""
        try:
            result = await self.coalescer(model, (*outputs, TOKENS_OUTPUT)).infer(inputs, parameters)
        except BadInput as exc:
            raise ApiError(400, f"tritonserver refused the texts: {exc}", "input") from None
        except Overloaded as exc:
            raise ApiError(429, f"Model is overloaded: {exc}", code="overloaded") from None
        except NotReady as exc:
            raise ApiError(503, f"tritonserver is not ready: {exc}", code="not_ready") from None
        except TimedOut:
            raise ApiError(504, f"no answer within api.timeout_s = {self.deployment.api.timeout_s} s") from None
        except TritonError as exc:
            raise ApiError(500, f"tritonserver failed: {exc}") from None
        context = CURRENT.get()
        if context is not None:
            context.tokens += int(result[TOKENS_OUTPUT].sum())
        return result


async def read_json(request: web.Request):
    body = await request.read()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:  # JSON that orjson refuses but Python reads: a lone surrogate (\ud800), which the schema then names
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON ({exc})") from None


def answer(data, status: int = 200, headers: dict | None = None) -> web.Response:
    body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def api_of(request: web.Request) -> Api:
    return request.app[API]
