"""The gRPC front: tenants' keys, rates and priority ceilings on server.grpc_port, with a keys file.

tritonserver's restricted protocol takes one key. With tenants.keys_file set, the launcher moves tritonserver's
gRPC to 127.0.0.1 (Ports.triton_grpc) and runs this front on server.grpc_port. Every method of KServe's
GRPCInferenceService passes through as bytes, unary and the ModelStreamInfer stream alike, with its metadata
(less the key) and its deadline; Triton's answer and status come back as they are. The inference methods
(ModelInfer, ModelStreamInfer, as Triton's restricted "inference" group) first need a tenant's key, in the
metadata `authorization` or Triton's own `triton-grpc-protocol-authorization` (serving/tenants.py):

- no tenant's key: UNAUTHENTICATED;
- a model's query lane (<model>-query) called by a tenant whose max_priority is ingestion: PERMISSION_DENIED
  naming the model to call;
- over the tenant's requests/s or texts/s (inputs[0].shape[0]; each message of a stream counts as a request):
  RESOURCE_EXHAUSTED with a `retry-after` trailer in whole seconds (a stream ends there).

Each such request is a span of its own with tracing on (serving/tracing.py), its context passed on to Triton.
The launcher runs front.workers (at least one) processes on the port (gRPC's servers set SO_REUSEPORT).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import grpc
from tritonclient.grpc import service_pb2

from common.contract import LANE_PARAMETER
from protocol.api_key import GRPC_HEADER, HEADER
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER
from serving.log import configure
from serving.tenant_limits import retry_after
from serving.tenants import Tenant, Tenants
from serving.tracing import Tracing, request_span, set_attribute
from settings import load_deployment, override_flags

log = logging.getLogger("grpc-front")
SERVICE = "/inference.GRPCInferenceService/"
STREAM = SERVICE + "ModelStreamInfer"
# Not passed on: the keys, and what gRPC sets itself on the next hop.
DROPPED = frozenset({HEADER, GRPC_HEADER, "user-agent", "content-type", "te", "grpc-timeout", "grpc-encoding"})
KEY_REQUIRED = "a valid API key is required: send authorization: Bearer <key>"
SERVER_ARGS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, wait_s: float = 0.0) -> None:
        super().__init__(message)
        self.code, self.wait_s = code, wait_s

    async def abort(self, context: grpc.aio.ServicerContext) -> None:
        trailers = (("retry-after", str(retry_after(self.wait_s))),) if self.wait_s else ()
        await context.abort(self.code, str(self), trailing_metadata=trailers)


def infer_shape(message: bytes) -> tuple[int, str, str]:
    """(inputs[0].shape[0], the model's name, its lane parameter) of a ModelInferRequest; one text and no name
    where it says nothing plain (Triton refuses what it cannot read)."""
    request = service_pb2.ModelInferRequest()
    try:
        request.ParseFromString(message)
    except Exception:  # protobuf's DecodeError: Triton answers it
        return 1, "", ""
    texts = request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 1
    lane = request.parameters[LANE_PARAMETER].string_param if LANE_PARAMETER in request.parameters else ""
    return max(0, texts), request.model_name, lane


class Front:
    """The forwarding of every method to tritonserver at `upstream`, tenants checked on the inference ones."""

    def __init__(self, upstream: str, tenants: Tenants, tracing: Tracing | None) -> None:
        self.channel = grpc.aio.insecure_channel(upstream, options=GRPC_CHANNEL_ARGS)
        self.tenants, self.tracing = tenants, tracing

    def tenant(self, metadata: dict[str, str]) -> Tenant:
        tenant = self.tenants.identify(metadata.get(HEADER) or metadata.get(GRPC_HEADER))
        if tenant is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, KEY_REQUIRED)
        return tenant

    def admit(self, tenant: Tenant, message: bytes) -> None:
        """Check one inference message of `tenant`: Refused when it may not pass."""
        capped = tenant.max_priority != "query"
        texts, model, lane = infer_shape(message) if capped or self.tenants.needs_shape(tenant) else (0, "", "")
        problem = self.tenants.priority_problem(tenant, model, lane)
        if problem:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, problem)
        wait = self.tenants.admit(tenant, 1, texts)
        if wait:
            rates = f"requests_per_s = {tenant.requests_per_s:g}, texts_per_s = {tenant.texts_per_s:g}"
            message = f"tenant {tenant.name!r} is over its rate ({rates})"
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, message, wait)

    async def unary(self, method: str, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        metadata = {key: value for key, value in context.invocation_metadata()}
        forwarded = [(k, v) for k, v in metadata.items() if k not in DROPPED and not k.startswith(":")]
        tenant = None
        with request_span(self.tracing, method, metadata, "") as trace:
            if method == MODEL_INFER:
                try:
                    tenant = self.tenant(metadata)
                    set_attribute(self.tracing, "tenant", tenant.name)
                    self.admit(tenant, message)
                except Refused as refused:
                    await refused.abort(context)
            call = self.channel.unary_unary(method)
            try:
                return await call(message, metadata=[*forwarded, *trace.items()], timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await upstream_error(exc, context, method, tenant)

    async def stream(self, messages, context: grpc.aio.ServicerContext):
        metadata = {key: value for key, value in context.invocation_metadata()}
        forwarded = [(k, v) for k, v in metadata.items() if k not in DROPPED and not k.startswith(":")]
        try:
            tenant = self.tenant(metadata)
        except Refused as refused:
            await refused.abort(context)
        upstream = self.channel.stream_stream(STREAM)(metadata=forwarded, timeout=context.time_remaining())
        refusal: list[Refused] = []

        async def pump() -> None:
            async for message in messages:
                try:
                    self.admit(tenant, message)
                except Refused as refused:
                    refusal.append(refused)
                    upstream.cancel()
                    return
                await upstream.write(message)
            await upstream.done_writing()

        sending = asyncio.create_task(pump())
        try:
            async for answer in upstream:
                yield answer
        except asyncio.CancelledError:
            if not refusal:
                raise
        except grpc.aio.AioRpcError as exc:
            if not refusal:
                await upstream_error(exc, context, STREAM, tenant)
        finally:
            sending.cancel()
        if refusal:
            await refusal[0].abort(context)


async def upstream_error(exc: grpc.aio.AioRpcError, context, method: str, tenant: Tenant | None) -> None:
    """Triton's status and trailers, as Triton sent them; its being down logged, naming the tenant."""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        name = tenant.name if tenant else None
        where = f"{method}" + (f" (tenant {name})" if name else "")
        log.error(f"{where}: tritonserver is not answering ({exc.details()})", extra={"tenant": name})
    await context.abort(exc.code(), exc.details() or "", trailing_metadata=tuple(exc.trailing_metadata() or ()))


class Handler(grpc.GenericRpcHandler):
    def __init__(self, front: Front) -> None:
        self.front = front

    def service(self, details: grpc.HandlerCallDetails):
        method = details.method
        if not method.startswith(SERVICE):
            return None  # UNIMPLEMENTED, as Triton answers
        if method == STREAM:
            return grpc.stream_stream_rpc_method_handler(self.front.stream)

        async def unary(message: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self.front.unary(method, message, context)

        return grpc.unary_unary_rpc_method_handler(unary)


def command(host: str, port: int, upstream_port: int, settings_paths, overrides) -> list[str]:
    """One worker's command line (after the interpreter), as FrontWorkers runs it."""
    return [
        "-m", "serving.grpc_front", "--host", host, "--port", str(port), "--upstream", f"127.0.0.1:{upstream_port}",
        "--settings", *map(str, settings_paths), *override_flags(overrides),
    ]  # fmt: skip


async def serve(host: str, port: int, upstream: str, tenants: Tenants, tracing: Tracing | None) -> None:
    server = grpc.aio.server(options=SERVER_ARGS)
    # The channel is made here, in the loop that runs it: a grpc.aio object belongs to the loop it was made in.
    server.add_generic_rpc_handlers((Handler(Front(upstream, tenants, tracing)),))
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.grpc_front", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="server.grpc_port: the tenants' buckets too")
    parser.add_argument("--upstream", required=True, help="tritonserver's gRPC, 127.0.0.1:port")
    parser.add_argument("--settings", nargs="*", default=[], help="the settings files (tenants, priority, tracing)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    args = parser.parse_args(argv)
    deployment = load_deployment(args.settings, args.set)
    configure(deployment.server.log_format)
    tenants = Tenants.of(deployment, args.port, "grpc")
    if tenants is None:
        parser.error("tenants.keys_file is not set: without tenants, tritonserver's own gRPC serves this port")
    tracing = Tracing.of(deployment.tracing, "grpc-front")
    asyncio.run(serve(args.host, args.port, args.upstream, tenants, tracing))
