"""The streaming one-stage model, `<model>-stream`: the data path of pipeline_model.py (stage_core.py) in one
process per GPU that tokenizes the next batch while the engine runs this one. It is decoupled, so tritonserver
2.51 answers it over gRPC streams (ModelStreamInfer) only; `ensemble` stays the unary model.

Why: a unary Python model overlaps nothing of its own, so the GPU was kept busy with 8 instances, 8 CUDA contexts
time-slicing it, each running batches of ~16 (docs/benchmarks.md). Here:
- execute() holds each request (its inputs, parameters and response sender) in the Intake and returns at once;
- the engine thread takes everything held, up to stream_max_texts texts, queries first (KServe parameter
  lane = "query"), tokenizes it and launches it on the engine (Engine.submit: asynchronous on a GPU), then
  collects the batch before it (so two are in flight: one computing, one being prepared);
- the sender threads cut each request's rows and send its one, final response: a send waits for tritonserver to
  take the answer (a round trip between the processes, the GIL released), so stream_senders threads send at once.
A request whose budget (parameter budget_us, from its arrival) is gone when a batch would take it is refused
unrun with "time budget ran out"; a batch the engine fails fails each of its requests with the reason.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import sys
import threading
import time
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

from common.contract import BUDGET_EXPIRED, BUDGET_PARAMETER, LANE_PARAMETER, WARMUP_TEXT

from . import pipeline_model
from .model_args import model_config
from .parent_watch import exit_with_parent
from .pipeline_model import response
from .stage_core import HeldRequest, Prepared, expired, held

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The engine thread waits for the GPU with the GIL released and needs it back soon to launch the next batch;
# CPython's default switch interval lets another thread keep it for 5 ms.
SWITCH_INTERVAL_S = 0.0005


class Intake:
    """Requests held until the engine thread takes them: queries, then the rest, each in arrival order."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._queries: deque[HeldRequest] = deque()
        self._rest: deque[HeldRequest] = deque()
        self.closed = False

    def put(self, requests: list[HeldRequest]) -> None:
        with self._ready:
            for request in requests:
                (self._queries if request.query_class else self._rest).append(request)
            self._ready.notify()

    def take(self, max_texts: int, wait: bool) -> tuple[list[HeldRequest], list[HeldRequest]] | None:
        """(a batch of at most max_texts texts, the requests whose budget ran out); waits for one when `wait`;
        None once closed and empty."""
        with self._ready:
            while wait and not (self._queries or self._rest or self.closed):
                self._ready.wait()
            if self.closed and not (self._queries or self._rest):
                return None
            batch, late, texts, now = [], [], 0, time.monotonic()
            for held_queue in (self._queries, self._rest):
                while held_queue:
                    request = held_queue[0]
                    if expired(request, now):
                        late.append(held_queue.popleft())
                        continue
                    if batch and texts + request.rows > max_texts:
                        return batch, late
                    batch.append(held_queue.popleft())
                    texts += request.rows
            return batch, late

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify()


class TritonPythonModel(pipeline_model.TritonPythonModel):
    """The pipeline model's stage core, metrics and answers, decoupled."""

    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _, parameters, _ = model_config(args)
        if int(parameters["stream_tokenizer_threads"]):  # read when the tokenizer first runs a batch
            os.environ["RAYON_NUM_THREADS"] = parameters["stream_tokenizer_threads"]
        # The Hugging Face tokenizer for every text: its batches run on its own threads with the GIL released, where
        # the ASCII fast path's Python would hold it from every other thread here (text_tokenizer.py).
        self._load(args, instances=1, fast_path=False)
        self.max_texts, senders = int(parameters["stream_max_texts"]), int(parameters["stream_senders"])
        self._warm_up()
        self.intake = Intake()
        self.answers: queue.SimpleQueue = queue.SimpleQueue()  # batches done: cut into each request's answer
        self.sends: queue.SimpleQueue = queue.SimpleQueue()  # (request, answer) to send
        self._engine = threading.Thread(target=self._run_engine, name="stream-engine", daemon=True)
        self._cutter = threading.Thread(target=self._run_cutter, name="stream-cutter", daemon=True)
        self._senders = [
            threading.Thread(target=self._run_sender, name=f"stream-sender-{index}", daemon=True)
            for index in range(senders)
        ]
        for thread in (self._engine, self._cutter, *self._senders):
            thread.start()
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def _warm_up(self) -> None:
        """What Triton's warm-up requests do for the unary model (a decoupled model gets none here): the engine's
        first shapes, captured before the first request."""
        for rows in (1, 8):
            text = np.array([[WARMUP_TEXT.encode()]] * rows, dtype=np.object_)
            self.core.answer([HeldRequest(text, text if self.core.pairs else None, "{}")])

    def execute(self, requests: list) -> None:
        arrived = time.monotonic()
        views = []
        for request in requests:
            view = held(request, self.core.pairs, pb_utils.get_input_tensor_by_name)
            view.sender = request.get_response_sender()
            if view.parameters_json != "{}":
                parameters = json.loads(view.parameters_json)
                view.query_class = parameters.get(LANE_PARAMETER) == "query"
                budget_us = parameters.get(BUDGET_PARAMETER)
                if isinstance(budget_us, int) and budget_us > 0:
                    view.deadline = arrived + budget_us / 1e6
            views.append(view)
        self.intake.put(views)

    def _run_engine(self) -> None:
        """Take, tokenize and launch a batch while the one before it computes; then collect that one."""
        in_flight: deque[Prepared] = deque()
        while True:
            taken = self.intake.take(self.max_texts, wait=not in_flight)
            if taken is None:
                break
            batch, late = taken
            if late:
                self.answers.put((late, [f"{BUDGET_EXPIRED} before a batch could take it"] * len(late)))
            if batch:
                try:
                    plain, others = self.core.split(batch)
                    if others:  # late chunks, a multi-vector model's sides: computed here, whole
                        chosen = [batch[i] for i in others]
                        self.answers.put((chosen, self.core.answer_other(chosen)))
                    if plain:
                        prepared = self.core.prepare([batch[i] for i in plain])
                        self.core.launch(prepared)
                        in_flight.append(prepared)
                except Exception as exc:  # the engine failed this batch: each of its requests is told, then the next
                    self._failed(batch, exc)
            while len(in_flight) > 1 or (in_flight and not batch):
                prepared = in_flight.popleft()
                try:
                    prepared.collect()
                except Exception as exc:
                    self._failed(prepared.requests, exc)
                    continue
                self.answers.put(prepared)
        self.answers.put(None)

    def _failed(self, requests: list[HeldRequest], exc: Exception) -> None:
        pb_utils.Logger.log_error(f"stream: a batch of {len(requests)} requests failed: {exc!r}")
        self.answers.put((requests, [f"the engine failed the batch: {exc}"] * len(requests)))

    def _run_cutter(self) -> None:
        """Each done batch cut into its requests' answers, handed to the senders."""
        while (item := self.answers.get()) is not None:
            if isinstance(item, Prepared):
                requests = item.requests
                try:
                    results = self.core.finish(item)
                except Exception as exc:
                    results = [f"the stage failed the batch: {exc}"] * len(requests)
            else:
                requests, results = item
            for pair in zip(requests, results, strict=True):
                self.sends.put(pair)
        for _ in self._senders:
            self.sends.put(None)

    def _run_sender(self) -> None:
        while (pair := self.sends.get()) is not None:
            request, result = pair
            sender, request.sender = request.sender, None  # once sent, nothing keeps the request (Triton unloads a
            try:  # model only when all its requests are released)
                sender.send(response(result), flags=FINAL)
            except Exception as exc:  # its stream is gone (the client cancelled): the others are still sent
                pb_utils.Logger.log_warn(f"stream: an answer could not be sent: {exc}")
            del sender, request, result, pair

    def finalize(self) -> None:
        """Serve what is held, then stop (tritonserver unloads a model once its requests are answered)."""
        self.intake.close()
        for thread in (self._engine, self._cutter, *self._senders):
            thread.join(timeout=30)
        super().finalize()
