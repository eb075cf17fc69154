"""TritonLink: the API front's asynchronous, pooled gRPC calls to tritonserver's `ensemble`.

Requests are built as KServe v2 protobufs directly (the texts as one raw length-prefixed BYTES tensor) and the
outputs read from raw_output_contents with numpy, so a call costs one protobuf encode and decode and no
tritonclient wrappers. Several channels per process (grpc.aio, round robin) keep one HTTP/2 connection from
serializing every stream of a busy worker. A call with more texts than the model's max_batch_size, or more
bytes than tokenizer.max_request_bytes, goes as several concurrent requests whose outputs are put back in order.

Triton's answers become one of four errors the front words for its clients: BadInput (the texts were
refused: INVALID_ARGUMENT), Overloaded (the model's queue is full: UNAVAILABLE "exceeds maximum queue size")
NotReady (nothing answers, the server is stopping, or a Python stage is being restarted) and TimedOut.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from client.core import GRPC_CHANNEL_ARGS, MODEL_INFER, TRANSIENT_MESSAGES, encoded_infer_request

MODEL = "ensemble"
DTYPES = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64}


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


def _bytes_tensor(raw: bytes, count: int) -> np.ndarray:
    items, offset = [], 0
    for _ in range(count):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        items.append(raw[offset + 4 : offset + 4 + size].decode("utf-8"))
        offset += 4 + size
    return np.array(items, dtype=object)


def decode_response(data: bytes) -> dict[str, np.ndarray]:
    response = service_pb2.ModelInferResponse.FromString(data)
    outputs = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        shape = tuple(tensor.shape)
        if tensor.datatype == "BYTES":
            outputs[tensor.name] = _bytes_tensor(raw, int(np.prod(shape)))
        else:
            outputs[tensor.name] = np.frombuffer(raw, dtype=DTYPES[tensor.datatype]).reshape(shape)
    return outputs


def _error(exc: grpc.aio.AioRpcError) -> TritonError:
    code, message = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadInput(message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TimedOut(message)
    if code == grpc.StatusCode.UNAVAILABLE and "queue" in message:
        return Overloaded(message)
    if code == grpc.StatusCode.UNAVAILABLE or any(text in message for text in TRANSIENT_MESSAGES):
        return NotReady(message)
    return TritonError(f"{code.name}: {message}")


class TritonLink:
    """gRPC to tritonserver at `target` (host:port) from one process, created inside its event loop."""

    def __init__(self, target: str, channels: int, max_texts: int, max_bytes: int, timeout_s: float) -> None:
        self.max_texts, self.max_bytes, self.timeout_s = max_texts, max_bytes, timeout_s
        self._channels = [grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_ARGS) for _ in range(channels)]
        self._calls = itertools.cycle(
            [
                channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)  # decoded below
                for channel in self._channels
            ]
        )

    async def _call(self, encoded: Sequence[bytes], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        try:
            data = await next(self._calls)(encoded_infer_request(MODEL, encoded, outputs), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return decode_response(data)

    async def infer(self, encoded: Sequence[bytes], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """The ensemble's `outputs` for texts already UTF-8, one row per text in order."""
        bounds = chunk_bounds([len(data) for data in encoded], self.max_texts, self.max_bytes)
        if len(bounds) == 1:
            return await self._call(encoded, outputs)
        parts = await asyncio.gather(*(self._call(encoded[bound], outputs) for bound in bounds))
        return {name: np.concatenate([part[name] for part in parts]) for name in outputs}

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))
