"""The four errors the API front words for its clients, from what tritonserver answered: a unary call's gRPC
status (call_error), or a stream answer's message (stream_error: a stream's answers carry no status code).

BadInput: the texts were refused (INVALID_ARGUMENT); Overloaded: the model's queue is full (UNAVAILABLE "exceeds
maximum queue size"); NotReady: nothing answers, the server is stopping, a Python stage is being restarted, or
the stream that held the request ended; TimedOut: its time budget ran out.
"""

from __future__ import annotations

import grpc

from common.contract import BUDGET_EXPIRED
from protocol.kserve_grpc import TRANSIENT_MESSAGES

# The streaming stage's words for a batch it could not run (stages/stream_model.py): the server's fault.
STAGE_FAILURES = ("the engine failed", "the stage failed")


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


def call_error(exc: grpc.aio.AioRpcError) -> TritonError:
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


def stream_error(message: str) -> TritonError:
    """A stream answer's error message as the error a unary call would have raised: the stage's refusals of the
    texts are BadInput, as their INVALID_ARG would have been."""
    if BUDGET_EXPIRED in message:
        return TimedOut(message)
    if any(text in message for text in TRANSIENT_MESSAGES):
        return NotReady(message)
    if "exceeds maximum queue size" in message:
        return Overloaded(message)
    if message.startswith(STAGE_FAILURES):
        return TritonError(message)
    return BadInput(message)
