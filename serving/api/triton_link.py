"""TritonLink: the API front's asynchronous, pooled gRPC calls to tritonserver's models.

Requests and responses are raw protobufs (protocol/kserve_grpc.py). Several channels per process (grpc.aio,
round robin) keep one HTTP/2 connection from serializing every stream of a busy worker. A call with more
texts than the model's max_batch_size, or more bytes than tokenizer.max_request_bytes, goes as several
concurrent requests whose outputs are put back in order (a sparse model's padded to the widest part).

A call with a time budget carries its deadline (parameter deadline_ns), so that a stage refuses it unrun once the
budget is gone: WAY_BACK_S before the front's own deadline, since an answer the stage finishes later reaches the
front after it has answered 504 (docs/probes.md, late_rows). Its gRPC deadline comes CANCEL_AFTER_S after the
budget, so that tritonserver has answered it by then: a call cancelled as its answer comes can crash tritonserver
2.51 (upstream issue 7368, fixed in 2.53; with 1-6 ms budgets it did, 2-3 times a minute on 2 cores:
docs/results/cpu-2026-12-06/grpc-cancel-crash/). Triton's answers become one of four errors the front words for its
clients (triton_errors.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import grpc
import numpy as np

from common.contract import DEADLINE_PARAMETER
from protocol.api_key import headers
from protocol.kserve_grpc import (
    GRPC_CHANNEL_ARGS,
    MODEL_INFER,
    decode_response,
    tensors_infer_message,
)
from protocol.packed import join_outputs
from serving.api.call_stats import CallStats
from serving.api.triton_errors import TimedOut, call_error

CANCEL_AFTER_S = 1.0  # a budgeted call's gRPC deadline after its budget (see above)
# The answer's way back from the stage to the front's waiter (the stub, tritonserver, gRPC, the worker's loop): on an
# H100 beside 16 x 64 ingestion, answers the stage finished up to 1.8 ms before their deadline still came late; with
# this margin, 3-17 of 1,000 5 ms requests ran for a 504 against 22-38 (docs/results/h100/owed-2026-12-07/).
WAY_BACK_S = 0.002


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


def stage_deadline_ns(timeout_s: float) -> int:
    """deadline_ns (CLOCK_MONOTONIC) of a call with timeout_s left: the latest the stage may finish it."""
    return time.monotonic_ns() + int((timeout_s - WAY_BACK_S) * 1e9)


class TritonLink:
    """gRPC to tritonserver at `target` (host:port) from one process, created inside its event loop."""

    def __init__(
        self,
        target: str,
        channels: int,
        timeout_s: float,
        stats: CallStats | None = None,
        key: str | None = None,
    ) -> None:
        self.timeout_s, self.stats = timeout_s, stats
        self._key = tuple(headers(key, "grpc").items())  # Triton's inference group asks for the key too
        self._channels = [grpc.aio.insecure_channel(target, options=GRPC_CHANNEL_ARGS) for _ in range(channels)]
        self._calls = itertools.cycle(
            [
                channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)  # decoded below
                for channel in self._channels
            ]
        )

    async def _call(
        self,
        model: str,
        inputs: dict[str, Sequence[bytes]],
        outputs: Sequence[str],
        requests: int,
        request_id: str,
        trace: dict[str, str],
        parameters: dict | None,
        timeout_s: float | None,
    ) -> dict:
        if self.stats is not None:
            self.stats.count(model, len(next(iter(inputs.values()))), requests)
        if timeout_s is not None and timeout_s <= 0:
            raise TimedOut("its time budget ran out before the call")
        timeout = self.timeout_s if timeout_s is None else min(timeout_s + CANCEL_AFTER_S, self.timeout_s)
        if timeout_s is not None:  # past its deadline the stage refuses it unrun
            parameters = {**(parameters or {}), DEADLINE_PARAMETER: stage_deadline_ns(timeout_s)}
        try:
            request = tensors_infer_message(model, inputs, outputs, request_id, parameters).SerializeToString()
            metadata = (*self._key, *trace.items()) or None
            data = await next(self._calls)(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc) from None
        return decode_response(data)

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
        parameters: dict | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """The model's `outputs` for rows of BYTES inputs already UTF-8 (every input one row per text), one
        output row per input row in order; split into requests of at most max_texts rows and max_bytes.
        `requests`: how many API requests the rows are (the Coalescer's), for the call statistics;
        `request_id`: Triton's id of the call(s), for its logs and traces; `trace`: W3C trace context headers
        (serving/tracing.py) that make Triton's spans part of the caller's trace; `parameters`: the request's
        KServe parameters (a sparse model's sparse_top_k, sparse_threshold); `timeout_s`: the budget, WAY_BACK_S
        before whose end the stage refuses the request unrun (deadline_ns); the gRPC deadline is CANCEL_AFTER_S
        after it, at most api.timeout_s."""
        trace = trace or {}
        rows = list(zip(*inputs.values(), strict=True))
        bounds = chunk_bounds([sum(map(len, row)) for row in rows], max_texts, max_bytes)
        if len(bounds) == 1:
            return await self._call(model, inputs, outputs, requests, request_id, trace, parameters, timeout_s)
        calls = [
            self._call(model, {name: values[bound] for name, values in inputs.items()}, outputs, 1, request_id, trace,
                       parameters, timeout_s)
            for bound in bounds
        ]  # fmt: skip
        parts = await asyncio.gather(*calls)
        return join_outputs(list(parts))

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))
