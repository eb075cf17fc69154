"""One gRPC stream (ModelStreamInfer) of a TextClient(stream=True) to a `<model>-stream`: each call one request
on it, matched back by its id, since a stream answers in any order (tritonclient's own stream callback drops the
id of an error, so this uses grpc directly). The stream opens with the first call, and again after it ends. An
answer that a stub of the model died fails the calls to it sent earlier, which that stub may hold and tritonserver
2.51 never answers: each is retryable, so TextClient sends it again within its deadline."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import grpc
from tritonclient.grpc import service_pb2

from protocol.kserve_grpc import (
    GRPC_CHANNEL_ARGS,
    MODEL_STREAM_INFER,
    STUB_DIED,
    TRANSIENT_MESSAGES,
    decode_infer_response,
    tensors_infer_request,
)


class StreamError(Exception):
    """The streaming model's answer to one call was an error (its message), or the stream ended under it."""


class TextStream:
    """Calls on one stream to tritonserver's gRPC at `url` (host:port), from any thread."""

    def __init__(self, url: str, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._channel = grpc.insecure_channel(url, options=GRPC_CHANNEL_ARGS)
        self._method = self._channel.stream_stream(
            MODEL_STREAM_INFER, response_deserializer=service_pb2.ModelStreamInferResponse.FromString
        )
        self._metadata = tuple(metadata) or None
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue | None = None
        self._owed: dict[str, tuple[Future, str]] = {}  # by request id (its number in the count): answer, model
        self._ids = itertools.count()

    def _open(self) -> queue.SimpleQueue:
        with self._lock:
            if self._outbox is None:
                outbox: queue.SimpleQueue = queue.SimpleQueue()
                answers = self._method(iter(outbox.get, None), metadata=self._metadata)
                threading.Thread(target=self._read, args=(answers, outbox), daemon=True, name="stream-read").start()
                self._outbox = outbox
            return self._outbox

    def _read(self, answers, outbox: queue.SimpleQueue) -> None:
        reason = "the stream ended"
        try:
            for answer in answers:
                request_id = answer.infer_response.id
                owed, model = self._owed.pop(request_id, (None, ""))
                if owed is None:
                    continue  # its caller gave up waiting
                if answer.error_message:  # "not now" answers are retryable, as a unary call's are (is_retryable)
                    transient = any(text in answer.error_message for text in TRANSIENT_MESSAGES)
                    owed.set_exception((ConnectionError if transient else StreamError)(answer.error_message))
                    if STUB_DIED in answer.error_message:
                        self._fail_held(model, int(request_id), answer.error_message)
                else:
                    owed.set_result(decode_infer_response(answer.infer_response))
        except grpc.RpcError as exc:
            reason = f"the stream ended: {exc.code().name}: {exc.details()}"
        finally:
            with self._lock:
                if self._outbox is outbox:
                    self._outbox = None
            for request_id in list(self._owed):
                owed, _ = self._owed.pop(request_id, (None, ""))
                if owed is not None and not owed.done():
                    owed.set_exception(ConnectionError(reason))  # retryable: the call is sent again

    def _fail_held(self, model: str, before: int, why: str) -> None:
        for request_id, (owed, owed_model) in list(self._owed.items()):
            if owed_model == model and int(request_id) < before and self._owed.pop(request_id, None) is not None:
                owed.set_exception(ConnectionError(f"{why} (a stub of {model} died, and may have held this call)"))

    def infer(self, model: str, inputs: dict, parameters: dict | None, timeout_s: float) -> dict:
        """The outputs of one request of BYTES rows by input name; StreamError for the model's refusal,
        TimeoutError past timeout_s, ConnectionError when the stream ended under it, a stub died or the model is
        being reloaded."""
        request_id = str(next(self._ids))
        owed: Future = Future()
        self._owed[request_id] = (owed, model)
        self._open().put(tensors_infer_request(model, inputs, (), request_id, parameters))
        try:
            return owed.result(timeout=timeout_s)
        except FutureTimeout:
            self._owed.pop(request_id, None)
            raise TimeoutError(f"no answer on the stream within {timeout_s:.3f} s") from None

    def close(self) -> None:
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
                self._outbox = None
        self._channel.close()
