"""TritonStreams: the API front's calls to a `<model>-stream` (model_repository/stages/stream_model.py) over
long-lived gRPC ModelStreamInfer streams, one per channel, each call one request matched back by its id.

A decoupled model answers over streams only (tritonserver 2.51 refuses it on unary ModelInfer). A stream's
answers carry no status code, only a message: stream_error() words it as TritonLink's errors. A stream that ends
(tritonserver restarted) fails the calls it held with NotReady, which the API front retries once on the unary
model, and the next call opens it again. A stub that dies leaves its stream open, and tritonserver 2.51 never
answers the requests that stub held (nor fails them): the first answer that says a stub of the model "is not
healthy" (a request routed to the dead one) fails every call to that model sent before it with NotReady, since
any of them may be held by the dead stub. Errors: serving/api/triton_errors.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from tritonclient.grpc import service_pb2

from protocol.kserve_grpc import MODEL_STREAM_INFER, STUB_DIED, decode_infer_response
from serving.api.triton_errors import NotReady, TimedOut, stream_error


@dataclass
class _Owed:
    answer: asyncio.Future
    model: str
    sent: int  # the TritonStreams' count of calls when it was sent


class _Stream:
    """One open ModelStreamInfer call and the answers it still owes, by request id; stub_died(model, sent) is told
    of an answer saying that a stub of `model` died, to the call numbered `sent`."""

    def __init__(self, method, metadata, stub_died: Callable[[str, int, str], None]) -> None:
        self.call = method(metadata=metadata)
        self.owed: dict[str, _Owed] = {}
        self.stub_died = stub_died
        self.writing = asyncio.Lock()  # one write at a time on a stream
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def open(self) -> bool:
        return not self.reader.done()

    async def _read(self) -> None:
        reason = "tritonserver ended the stream"
        try:
            async for data in self.call:
                answer = service_pb2.ModelStreamInferResponse.FromString(data)
                owed = self.owed.pop(answer.infer_response.id, None)
                if owed is None or owed.answer.done():
                    continue  # its caller stopped waiting (its deadline passed)
                if answer.error_message:
                    owed.answer.set_exception(stream_error(answer.error_message))
                    if STUB_DIED in answer.error_message:
                        self.stub_died(owed.model, owed.sent, answer.error_message)
                else:
                    owed.answer.set_result(decode_infer_response(answer.infer_response))
        except grpc.aio.AioRpcError as exc:
            reason = f"the stream to tritonserver ended: {exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "the API front is closing"
        finally:
            for owed in self.owed.values():  # they were sent; whether they ran is unknown: a retry may run them twice
                if not owed.answer.done():
                    owed.answer.set_exception(NotReady(f"{reason} ({STUB_DIED}: it held this request)"))
            self.owed.clear()

    def fail_held(self, model: str, before: int, why: str) -> None:
        """Fails the calls to `model` sent before call number `before`: a stub that died may hold them."""
        for request_id, owed in list(self.owed.items()):
            if owed.model == model and owed.sent < before:
                del self.owed[request_id]
                if not owed.answer.done():
                    owed.answer.set_exception(
                        NotReady(f"{why} (a stub of {model} died, and may have held this request)")
                    )

    async def send(self, request_id: str, model: str, sent: int, request: bytes) -> asyncio.Future:
        owed = asyncio.get_running_loop().create_future()
        self.owed[request_id] = _Owed(owed, model, sent)
        try:
            async with self.writing:
                await self.call.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            self.owed.pop(request_id, None)
            raise NotReady(f"the stream to tritonserver is closed: {exc}") from None
        return owed

    def close(self) -> None:
        self.call.cancel()


class TritonStreams:
    """ModelStreamInfer streams over the given channels, opened when first used and again after one ends."""

    def __init__(self, channels: list[grpc.aio.Channel], metadata: tuple) -> None:
        self._methods = [
            channel.stream_stream(MODEL_STREAM_INFER, response_deserializer=lambda data: data) for channel in channels
        ]
        self._metadata = metadata or None
        self._streams: list[_Stream | None] = [None] * len(channels)
        self._turn = itertools.cycle(range(len(channels)))
        self._ids = itertools.count()

    async def call(self, request: service_pb2.ModelInferRequest, timeout_s: float) -> dict:
        """The outputs of one request sent on the next stream; TimedOut after timeout_s (the answer, if it comes
        later, is dropped)."""
        sent = next(self._ids)
        request.id = f"{sent}:{request.id}"  # unique on its stream: answers come back in any order
        index = next(self._turn)
        stream = self._streams[index]
        if stream is None or not stream.open:
            stream = self._streams[index] = _Stream(self._methods[index], self._metadata, self._stub_died)
        owed = await stream.send(request.id, request.model_name, sent, request.SerializeToString())
        try:
            return await asyncio.wait_for(owed, timeout_s)
        except asyncio.TimeoutError:
            stream.owed.pop(request.id, None)
            raise TimedOut(f"no answer within {timeout_s:.3f} s") from None

    def _stub_died(self, model: str, sent: int, message: str) -> None:
        """Call number `sent` found a dead stub of `model`: the stub died before it, so whatever the dead stub held
        was sent before it, on any stream."""
        for stream in self._streams:
            if stream is not None:
                stream.fail_held(model, sent, message)

    def close(self) -> None:
        for stream in self._streams:
            if stream is not None:
                stream.close()
