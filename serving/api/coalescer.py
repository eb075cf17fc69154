"""Coalescer: the texts of concurrent API requests to one model go to Triton as one call of many texts.

Triton's cost is mostly per request (the gRPC call, the scheduler, the Python stage's execute()), not per text,
so one call of 8 texts costs far less than 8 calls of one. Within one worker and one model:

- a request that finds no call of its model in flight is sent at once: a lone caller (c=1) waits for nothing;
- while fewer than api.coalesce_calls calls are in flight, a request waits at most api.coalesce_window_ms for
  others to join it (at once when they fill ensemble.max_batch_size texts);
- with api.coalesce_calls in flight, requests queue, and each call that ends sends what has queued since.

A call carries at most ensemble.max_batch_size texts and tokenizer.max_request_bytes; a request that alone
reaches either goes by itself (TritonLink splits it). Each request gets its own rows back, in order. The texts
were checked before they queued (schema.py); if Triton still refuses a coalesced call, each of its requests is
sent again alone, so a bad text fails its own request only. A request whose client went away (aiohttp cancels
its handler) leaves the queue; once sent, its rows are computed and dropped. api.coalesce_calls = 0: every
request is a call of its own. Each request's RequestContext gets the time it queued and the time of the
call that carried it; the call's Triton id lists the ids of its requests, and it carries the trace context
of the first of them that is traced. A request with KServe parameters of its own (a sparse model's top_k,
threshold, a multi-vector model's queries) goes alone: one call carries one set. A request with a deadline
(serving/api/priority.py) that passes while it queues leaves the queue unsent (TimedOut), and each request stops
waiting at its own. A call's budget is its requests' earliest deadline: the stage refuses the call unrun once that
cannot be met, so no row runs for a request already answered 504. The requests of such a refused call that still
have time are sent again alone, each with its own budget. No call is cancelled once sent (`_track`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from protocol.packed import split_outputs
from serving.api.request_context import CURRENT, RequestContext
from serving.api.triton_errors import BadInput, TimedOut
from serving.api.triton_link import TritonLink

MAX_ID_CHARS = 1024  # Triton's id of a coalesced call: its requests' ids, as many as fit


@dataclass(eq=False)
class _Request:
    inputs: dict[str, list[bytes]]
    rows: int
    size: int
    parameters: dict | None = None
    deadline: float | None = None  # perf_counter() time
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    context: RequestContext | None = field(default_factory=CURRENT.get)
    queued: float = field(default_factory=time.perf_counter)

    @property
    def id(self) -> str:
        return self.context.id if self.context else ""

    @property
    def trace(self) -> dict[str, str]:
        return self.context.trace if self.context else {}


def _timed(context: RequestContext | None, started: float, queued: float = 0.0) -> None:
    if context is not None:
        context.queue_s += queued
        context.inference_s += time.perf_counter() - started


def _earliest(batch: list[_Request]) -> float | None:
    """A call's budget: until its requests' earliest deadline (None: the link's own when one has none)."""
    if any(request.deadline is None for request in batch):
        return None
    return min(request.deadline for request in batch) - time.perf_counter()


class Coalescer:
    """One Triton model's calls (with these `outputs`) from one worker."""

    def __init__(
        self,
        link: TritonLink,
        model: str,
        outputs: list[str],
        max_texts: int,
        max_bytes: int,
        max_calls: int,
        window_s: float,
        parameters: dict | None = None,
    ) -> None:
        """parameters: KServe parameters every call carries (a prompt, a query's lane)."""
        self.link, self.model, self.outputs, self.parameters = link, model, outputs, parameters or {}
        self.max_texts, self.max_bytes = max_texts, max_bytes
        self.max_calls, self.window_s = max_calls, window_s
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task] = set()  # referenced until done: the loop keeps weak references only

    async def infer(
        self,
        inputs: dict[str, list[bytes]],
        parameters: dict | None = None,
        deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        """The outputs for these rows (every input one row per text), as if they had been a call of their own;
        TimedOut once `deadline` (perf_counter() time) has passed."""
        rows = len(next(iter(inputs.values())))
        size = sum(len(value) for values in inputs.values() for value in values)
        if deadline is not None and deadline <= time.perf_counter():
            raise TimedOut("its time budget ran out before a call could carry it")
        if parameters or self.max_calls == 0 or rows >= self.max_texts or size >= self.max_bytes:
            request = _Request(inputs, rows, size, parameters, deadline)
            self._track(self._alone(request))  # a call of its own, never cancelled (_Request's timer answers)
        else:
            request = _Request(inputs, rows, size, deadline=deadline)
            self._queue.append(request)
            self._queued_rows += rows
            self._dispatch()
        # A timer of the loop's own, not asyncio.wait_for: every request has a deadline (api.timeout_s at least),
        # and wait_for's extra future and callbacks cost about 6 us a request against the timer's 2.
        timer = None if deadline is None else asyncio.get_running_loop().call_later(
            deadline - time.perf_counter(), self._expire, request
        )  # fmt: skip
        try:
            return await request.answer
        except asyncio.CancelledError:  # the client went away: give up the place if it is still queued
            self._leave(request)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, request: _Request) -> None:
        """Its budget ran out while it waited, queued or in a call: it stops waiting, and leaves the queue."""
        if not request.answer.done():
            request.answer.set_exception(TimedOut("its time budget ran out while it waited"))
            self._leave(request)

    def _leave(self, request: _Request) -> None:
        if request in self._queue:
            self._queue.remove(request)
            self._queued_rows -= request.rows

    def _dispatch(self) -> None:
        while self._queue and self._in_flight < self.max_calls:
            if self._in_flight and self._queued_rows < self.max_texts and self.window_s > 0:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(self.window_s, self._window_closed)
                return
            self._send()

    def _window_closed(self) -> None:
        self._timer = None
        self._send_while_free()

    def _send_while_free(self) -> None:
        while self._queue and self._in_flight < self.max_calls:
            self._send()

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, rows, size = [], 0, 0
        while self._queue:
            request = self._queue[0]
            if request.answer.done():  # its client went away: cancelled now, it leaves the queue a loop step later
                self._queue.popleft()
                self._queued_rows -= request.rows
                continue
            if batch and (rows + request.rows > self.max_texts or size + request.size > self.max_bytes):
                break
            batch.append(self._queue.popleft())
            rows, size = rows + request.rows, size + request.size
        self._queued_rows -= rows
        self._in_flight += 1
        self._track(self._call(batch, time.perf_counter()))

    def _track(self, call) -> None:
        """A call run to its end whoever still waits for it: a request stops waiting at its deadline or when its
        client goes away, but its call is not cancelled. Tritonserver 2.51 can crash (signal 11) when a call's
        cancellation meets its answer (upstream issue 7368, fixed in 2.53), which short budgets made common."""
        task = asyncio.get_running_loop().create_task(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[_Request], sent: float) -> None:
        try:
            inputs = {name: [value for request in batch for value in request.inputs[name]] for name in batch[0].inputs}
            ids = ",".join(request.id for request in batch)[:MAX_ID_CHARS]
            trace = next((request.trace for request in batch if request.trace), {})  # the first traced one's
            try:
                try:
                    outputs = await self.link.infer(
                        self.model, inputs, self.outputs, self.max_texts, self.max_bytes, len(batch), ids, trace,
                        parameters=self.parameters or None, timeout_s=_earliest(batch),
                    )  # fmt: skip
                finally:  # this call's time, before any retry below adds its own
                    for request in batch:
                        _timed(request.context, sent, sent - request.queued)
            except BadInput:
                if len(batch) == 1:
                    raise
                await asyncio.gather(*(self._alone(request) for request in batch))
                return
            except TimedOut:  # the earliest deadline could not be met: the others go again with their own
                if len(batch) == 1:
                    raise
                now = time.perf_counter()
                await asyncio.gather(*(self._alone(request) for request in batch if (request.deadline or 0.0) > now))
                raise
            for request, part in zip(batch, split_outputs(outputs, [request.rows for request in batch]), strict=True):
                if not request.answer.done():
                    request.answer.set_result(part)
        except Exception as exc:  # the call failed for every request in it
            for request in batch:
                if not request.answer.done():
                    request.answer.set_exception(exc)
        finally:
            self._in_flight -= 1
            self._send_while_free()  # what queued meanwhile waited for this call already

    async def _alone(self, request: _Request) -> None:
        """A call of its own for one request, its answer (or failure) put in request.answer if still awaited."""
        started = time.perf_counter()
        try:
            answer = await self.link.infer(
                self.model, request.inputs, self.outputs, self.max_texts, self.max_bytes, 1, request.id, request.trace,
                parameters={**self.parameters, **(request.parameters or {})} or None, timeout_s=_earliest([request]),
            )  # fmt: skip
        except Exception as exc:
            if not request.answer.done():
                request.answer.set_exception(exc)
        else:
            if not request.answer.done():
                request.answer.set_result(answer)
        finally:  # before its waiter resumes, which is a loop step later
            _timed(request.context, started)
