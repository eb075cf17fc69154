"""The four errors the API front words for its clients, from a call's gRPC status (call_error).

BadInput: the texts were refused (INVALID_ARGUMENT); Overloaded: the model's queue is full (UNAVAILABLE "exceeds
maximum queue size"); NotReady: nothing answers, the server is stopping, or a Python stage is being restarted;
TimedOut: its time budget ran out (DEADLINE_EXCEEDED, or the stage's refusal of a request past its deadline).
"""

from __future__ import annotations

import grpc

from common.contract import BUDGET_EXPIRED
from protocol.kserve_grpc import TRANSIENT_MESSAGES


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
    if BUDGET_EXPIRED in message:
        return TimedOut(message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadInput(message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TimedOut(message)
    if code == grpc.StatusCode.UNAVAILABLE and "queue" in message:
        return Overloaded(message)
    if code == grpc.StatusCode.UNAVAILABLE or any(text in message for text in TRANSIENT_MESSAGES):
        return NotReady(message)
    return TritonError(f"{code.name}: {message}")
