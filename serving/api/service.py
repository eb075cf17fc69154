"""What every route of the API front shares in one worker: the served models, the gRPC link to Triton with a
Coalescer per model (and Triton's refusals worded for the caller), the call statistics, and reading and
writing JSON."""

from __future__ import annotations

import json
import time

import aiohttp
import orjson
from aiohttp import web

from common.contract import LANE_PARAMETER, PROMPT_PARAMETER, TOKENS_OUTPUT
from common.gpu_board import GpuBoard
from protocol.api_key import api_key
from serving.api.call_stats import CallStats
from serving.api.coalescer import Coalescer
from serving.api.models import Models, ServedModel
from serving.api.priority import settle
from serving.api.request_context import CURRENT, RequestContext
from serving.api.schema import ApiError
from serving.api.triton_errors import BadInput, NotReady, Overloaded, TimedOut, TritonError
from serving.api.triton_link import TritonLink
from serving.tenant_limits import retry_after
from serving.tenants import Tenants
from serving.tracing import Tracing
from settings import Deployment

API = web.AppKey("api", object)


class Api:
    """What every route shares in one worker process."""

    def __init__(
        self,
        deployment: Deployment,
        models: Models,
        port: int,
        grpc_target: str,
        ready_url: str,
        metrics_url: str,
        board: GpuBoard | None = None,
    ):
        """board: the server's GPU board, where the stubs say whether ingestion runs; without one a query always
        goes to its model's query lane."""
        self.deployment, self.models, self.board = deployment, models, board
        self.grpc_target, self.ready_url, self.metrics_url = grpc_target, ready_url, metrics_url
        self.api_key = api_key()
        self.in_flight = 0
        self.created = int(time.time())
        lanes = [model.query_lane for model in models.all if model.query_lane]
        self.stats = CallStats(port, [model.triton for model in models.all] + lanes)
        self.tracing = Tracing.of(deployment.tracing, "api")
        # Rates shared with the server's other fronts: those of its (public) gRPC port, server.grpc_port.
        self.tenants = Tenants.of(deployment, deployment.server.grpc_port, "api")
        self.link: TritonLink | None = None
        self.session: aiohttp.ClientSession | None = None
        self._coalescers: dict[tuple, Coalescer] = {}

    async def start(self, app: web.Application):
        settings = self.deployment.api
        self.link = TritonLink(self.grpc_target, settings.grpc_channels, settings.timeout_s, self.stats, self.api_key)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        yield
        await self.link.close()
        await self.session.close()
        self.stats.close()
        if self.tracing is not None:
            self.tracing.shutdown()

    def coalescer(self, triton: str, model: ServedModel, outputs: tuple[str, ...], lane: str = "") -> Coalescer:
        """The Coalescer of one Triton model (the model's or its query lane) and outputs, and `lane` (a query sent to
        the model itself): queries and ingestion never share a call, nor wait for each other's."""
        key = (triton, outputs, lane)
        if key not in self._coalescers:
            settings = self.deployment.api
            # The routes put a model's default prompt in front of the texts themselves (ServedModel.prompt), so
            # its calls ask the stage for none.
            parameters = {PROMPT_PARAMETER: ""} if model.spec.default_prompt_name else {}
            parameters |= {LANE_PARAMETER: lane} if lane else {}
            self._coalescers[key] = Coalescer(
                self.link, triton, list(outputs), model.max_texts, model.max_bytes,
                settings.coalesce_calls, settings.coalesce_window_ms / 1000, parameters or None,
            )  # fmt: skip
        return self._coalescers[key]

    async def _call(self, model: ServedModel, inputs, outputs, parameters, priority_class: str, context) -> dict:
        """A query goes to the query lane while ingestion runs, else to the model itself, named a query
        (work-conserving: queries alone get every instance); ingestion to the model."""
        triton, lane = model.triton, ""
        if priority_class == "query" and model.query_lane:
            if self.board is None or self.board.ingesting():
                triton = model.query_lane
            else:
                lane = priority_class
        return await self.coalescer(triton, model, outputs, lane).infer(inputs, parameters, context.deadline)

    async def infer(
        self, model: ServedModel, inputs: dict[str, list[bytes]], outputs: list[str], parameters: dict | None = None
    ) -> dict:
        """The model's outputs and each row's token count, Triton's refusals worded for the caller; `parameters`:
        KServe request parameters (such a request is a call of its own)."""
        # --- tenants (serving/tenants.py): texts/s is charged here, where a request's texts are counted ---
        context = CURRENT.get()
        if self.tenants is not None and context is not None and context.tenant:
            texts = len(next(iter(inputs.values()), []))
            wait = self.tenants.admit_texts(context.tenant, texts)
            if wait:
                tenant = self.tenants.named(context.tenant)
                message = f"tenant {context.tenant!r} is over its texts_per_s = {tenant.texts_per_s:g}"
                raise ApiError(429, message, code="rate_limit_exceeded", retry_after=retry_after(wait))
        # --- end of tenants ---
        context = context or RequestContext("")
        rows = len(next(iter(inputs.values())))
        priority_class = settle(context, self.deployment.priority, rows, self.deployment.api.timeout_s)
        queued = context.queue_s
        try:
            result = await self._call(model, inputs, (*outputs, TOKENS_OUTPUT), parameters, priority_class, context)
        except BadInput as exc:
            raise ApiError(400, f"tritonserver refused the texts: {exc}", "input") from None
        except Overloaded as exc:
            self.stats.count_class(priority_class, "overloaded")
            raise ApiError(429, f"Model is overloaded: {exc}", code="overloaded") from None
        except NotReady as exc:
            raise ApiError(503, f"tritonserver is not ready: {exc}", code="not_ready") from None
        except TimedOut as exc:
            self.stats.count_class(priority_class, "timed_out")
            budget = (context.deadline or 0) - context.started
            raise ApiError(504, f"no answer within its time budget of {budget:.3f} s: {exc}", code="timeout") from None
        except TritonError as exc:
            raise ApiError(500, f"tritonserver failed: {exc}") from None
        self.stats.count_class(priority_class, "served", context.queue_s - queued)
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
