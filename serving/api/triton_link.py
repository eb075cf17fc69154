"""TritonLink: the API front's asynchronous, pooled calls to tritonserver's models, over its HTTP or its gRPC.

api.triton_protocol picks the transport. "http": aiohttp to Triton's HTTP port with the binary tensor
extension (protocol/kserve_http.py), keep-alive connections on the worker's own event loop; "grpc": raw
protobufs (protocol/kserve_grpc.py) over api.grpc_channels grpc.aio channels, round robin, so that one
HTTP/2 connection does not serialize every stream of a busy worker. grpc.aio hands every call to and from
threads of its own: a lone call costs ~3x the HTTP one in latency and CPU on both sides
(`python -m bench.triton_clients`, docs/api.md). A call with more texts than the model's max_batch_size, or
more bytes than tokenizer.max_request_bytes, goes as several concurrent requests whose outputs are put back
in order.

Triton's answers become one of four errors the front words for its clients: BadInput (the texts were
refused: INVALID_ARGUMENT, HTTP 400), Overloaded (the model's queue is full: "exceeds maximum queue size"),
NotReady (nothing answers, the server is stopping, or a Python stage is being restarted) and TimedOut.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import aiohttp
import grpc
import numpy as np

from protocol.api_key import headers
from protocol.kserve_grpc import (
    GRPC_CHANNEL_ARGS,
    MODEL_INFER,
    TRANSIENT_MESSAGES,
    decode_response,
    tensors_infer_request,
)
from protocol.kserve_http import HEADER_LENGTH, decode_infer_response, error_message, infer_body
from serving.api.call_stats import CallStats

PROTOCOLS = ("http", "grpc")


class TritonError(Exception):
    """A call tritonserver did not answer with outputs."""


class BadInput(TritonError):
    pass


class Overloaded(TritonError):
    pass


class NotReady(TritonError):
    pass


class TimedOut(TritonError):
    pass


def chunk_bounds(sizes: Sequence[int], max_texts: int, max_bytes: int) -> list[slice]:
    """Consecutive runs of texts (by UTF-8 size) with at most max_texts texts and max_bytes bytes each; a
    single text over max_bytes gets a run of its own (Triton refuses it, naming its limit)."""
    bounds, start, total = [], 0, 0
    for index, size in enumerate(sizes):
        if index > start and (index - start == max_texts or total + size > max_bytes):
            bounds.append(slice(start, index))
            start, total = index, 0
        total += size
    bounds.append(slice(start, len(sizes)))
    return bounds


def _refusal(status: str, message: str, bad_input: bool, unavailable: bool) -> TritonError:
    """Triton's refusal as the error the front words: `bad_input` its INVALID_ARGUMENT (HTTP 400), `unavailable`
    its UNAVAILABLE (HTTP 503); any other, named by its `status`."""
    if bad_input:
        return BadInput(message)
    if unavailable and "queue" in message:
        return Overloaded(message)
    if unavailable or any(text in message for text in TRANSIENT_MESSAGES):
        return NotReady(message)
    return TritonError(f"{status}: {message}")


class GrpcCalls:
    """ModelInfer over `channels` grpc.aio channels to `target` (host:port), round robin."""

    def __init__(self, target: str, channels: int, timeout_s: float, key: str | None) -> None:
        self.timeout_s = timeout_s
        self._key = tuple(headers(key, "grpc").items())  # Triton's inference group asks for the key too
        self._channels = [grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_ARGS) for _ in range(channels)]
        self._calls = itertools.cycle(
            [
                channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)  # decoded below
                for channel in self._channels
            ]
        )

    async def infer(
        self, model: str, inputs: dict[str, Sequence[bytes]], outputs: Sequence[str], request_id: str, trace: dict
    ) -> dict[str, np.ndarray]:
        request = tensors_infer_request(model, inputs, outputs, request_id)
        metadata = (*self._key, *trace.items()) or None
        try:
            data = await next(self._calls)(request, timeout=self.timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            code, message = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimedOut(message) from None
            bad, unavailable = code == grpc.StatusCode.INVALID_ARGUMENT, code == grpc.StatusCode.UNAVAILABLE
            raise _refusal(code.name, message, bad, unavailable) from None
        return decode_response(data)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))


class HttpCalls:
    """POST /v2/models/<model>/infer to Triton's HTTP at `target` (host:port), binary tensors, kept alive."""

    def __init__(self, target: str, timeout_s: float, key: str | None) -> None:
        self._base = f"http://{target}/v2/models/"
        self._key = headers(key, "http")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout_s)
        )

    async def infer(
        self, model: str, inputs: dict[str, Sequence[bytes]], outputs: Sequence[str], request_id: str, trace: dict
    ) -> dict[str, np.ndarray]:
        body, fields = infer_body(inputs, outputs, request_id)
        try:
            async with self._session.post(
                f"{self._base}{model}/infer", data=body, headers={**fields, **self._key, **trace}
            ) as response:
                data = await response.read()
                if response.status == 200:
                    return decode_infer_response(data, response.headers.get(HEADER_LENGTH))
                message = error_message(data)
        except asyncio.TimeoutError:
            raise TimedOut("no answer in time") from None
        except aiohttp.ClientError as exc:  # refused, reset or cut off: nothing answers now
            raise NotReady(str(exc) or type(exc).__name__) from None
        raise _refusal(f"HTTP {response.status}", message, response.status == 400, response.status == 503)

    async def close(self) -> None:
        await self._session.close()


class TritonLink:
    """Calls to tritonserver from one process, created inside its event loop: over `protocol` ("http" or "grpc")
    to its port at `target` (host:port), with `channels` connections for gRPC."""

    def __init__(
        self,
        protocol: str,
        target: str,
        channels: int,
        timeout_s: float,
        stats: CallStats | None = None,
        key: str | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"the link to tritonserver speaks one of {PROTOCOLS}, not {protocol!r}")
        self.stats = stats
        self._calls = (
            HttpCalls(target, timeout_s, key) if protocol == "http" else GrpcCalls(target, channels, timeout_s, key)
        )

    async def _call(
        self,
        model: str,
        inputs: dict[str, Sequence[bytes]],
        outputs: Sequence[str],
        requests: int,
        request_id: str,
        trace: dict[str, str],
    ) -> dict:
        if self.stats is not None:
            self.stats.count(model, len(next(iter(inputs.values()))), requests)
        return await self._calls.infer(model, inputs, outputs, request_id, trace)

    async def infer(
        self,
        model: str,
        inputs: dict[str, Sequence[bytes]],
        outputs: Sequence[str],
        max_texts: int,
        max_bytes: int,
        requests: int = 1,
        request_id: str = "",
        trace: dict[str, str] | None = None,
    ) -> dict[str, np.ndarray]:
        """The model's `outputs` for rows of BYTES inputs already UTF-8 (every input one row per text), one
        output row per input row in order; split into requests of at most max_texts rows and max_bytes.
        `requests`: how many API requests the rows are (the Coalescer's), for the call statistics;
        `request_id`: Triton's id of the call(s), for its logs and traces; `trace`: W3C trace context headers
        (serving/tracing.py) that make Triton's spans part of the caller's trace."""
        trace = trace or {}
        rows = list(zip(*inputs.values(), strict=True))
        bounds = chunk_bounds([sum(map(len, row)) for row in rows], max_texts, max_bytes)
        if len(bounds) == 1:
            return await self._call(model, inputs, outputs, requests, request_id, trace)
        parts = await asyncio.gather(
            *(
                self._call(
                    model, {name: values[bound] for name, values in inputs.items()}, outputs, 1, request_id, trace
                )
                for bound in bounds
            )
        )
        return {name: np.concatenate([part[name] for part in parts]) for name in outputs}

    async def close(self) -> None:
        await self._calls.close()
