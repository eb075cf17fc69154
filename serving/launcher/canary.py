"""The liveness canary: one short inference per served model, so that a tritonserver or a stub that hangs without
exiting is found and killed.

Triton 2.51 can hang without exiting (seen: a SIGSEGV under its own tracing, then no answers and no exit) while
/v2/health/ready stays 200 and every call runs into its deadline; only a real inference tells. So can a stub: alive,
so the watchdog (which sees a stub that dies) does not notice, while its requests wait forever. Every
server.canary_interval_s, the Canary sends each client-facing model, and its query lane where it has one
([priority]), one short text (and a reranker's query) through tritonserver's own gRPC, with a deadline of
server.canary_timeout_s. An answer passes when it has every output the model's config promises (its task's: an
embedding of the served width, a reranker's score, ...), of that shape, with finite values.

A model whose canaries fail (an error, a wrong answer, no answer, a model not ready) for canary_timeout_s is asked
how many requests it answered meanwhile (tritonserver's ModelStatistics: succeeded plus failed):
- no answer to that either: tritonserver is hung, and on_hang gets Hang(None, reason): the Supervisor
  (supervision.py) kills it;
- a canary that ran out of its deadline while the model answered other requests since its last good canary: it is
  busy (seconds of ingestion queued ahead of the canary), not hung, and the failing run starts again;
- else (nothing answered, or wrong answers): its stubs are hung or broken: Hang(model, reason), and the Supervisor
  kills them for the watchdog to reload.
One hung instance among several that still answer is not seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from common.contract import CHUNK_COUNTS, CHUNK_EMBEDDINGS, PACKED_OUTPUTS, TOKEN_VECTORS_FP32, TOKENS_OUTPUT
from protocol.api_key import api_key, headers
from protocol.kserve_grpc import (
    GRPC_CHANNEL_ARGS,
    MODEL_INFER,
    MODEL_STATISTICS,
    decode_response,
    tensors_infer_request,
)
from settings import Deployment

log = logging.getLogger("launcher")

CANARY_TEXT = "Liveness canary."
# Outputs a request must ask for, by a parameter (an embedder's late chunks) or alone (fp32 token vectors): not part
# of every answer.
ON_REQUEST_OUTPUTS = (CHUNK_EMBEDDINGS, CHUNK_COUNTS, TOKEN_VECTORS_FP32)
DTYPES = {
    mc.TYPE_FP16: np.float16,
    mc.TYPE_FP32: np.float32,
    mc.TYPE_INT32: np.int32,
    mc.TYPE_INT64: np.int64,
    mc.TYPE_STRING: object,
}
# A statistics call is answered by tritonserver's frontend alone, at once; it waits at most this (or the timeout).
STATISTICS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Hang:
    """What the canary found hung: `model`'s stubs, or tritonserver itself (model None); and why."""

    model: str | None
    reason: str


@dataclass(frozen=True)
class Probe:
    """One model's canary: the serialized request, and each output it must answer as (dtype, dims per text)."""

    model: str
    request: bytes
    outputs: dict[str, tuple[type, tuple[int, ...]]]


def probe_for(config: mc.ModelConfig) -> Probe:
    """The canary of a served model from its config: one row of every input, every output it always answers."""
    inputs = {tensor.name: [CANARY_TEXT.encode()] for tensor in config.input}
    outputs = {
        tensor.name: (DTYPES[tensor.data_type], tuple(tensor.dims))
        for tensor in config.output
        if tensor.name not in ON_REQUEST_OUTPUTS
    }
    return Probe(config.name, tensors_infer_request(config.name, inputs, list(outputs)), outputs)


def answer_problem(answer: dict[str, np.ndarray], outputs: dict[str, tuple[type, tuple[int, ...]]]) -> str | None:
    """What is wrong with a canary's answer (None: nothing): an output missing, of another type or shape than
    the config's for one text (a packed output: as many rows as its count says), a value that is not finite, or a
    token count below one."""
    for name, (dtype, dims) in outputs.items():
        if name not in answer:
            return f"no {name} output"
        array = answer[name]
        if array.dtype != np.dtype(dtype):
            return f"{name} is {array.dtype}, not {np.dtype(dtype)}"
        rows = int(answer[PACKED_OUTPUTS[name]].sum()) if PACKED_OUTPUTS.get(name) in answer else 1
        shape_ok = len(array.shape) == len(dims) + 1 and array.shape[0] == rows
        if not shape_ok or any(want not in (-1, got) for want, got in zip(dims, array.shape[1:], strict=True)):
            return f"{name} has shape {list(array.shape)}, not [{rows}, {', '.join(map(str, dims))}]"
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"{name} has values that are not finite"
        if name == TOKENS_OUTPUT and array.min(initial=1) < 1:
            return f"{name} counts {array.min()} tokens"
    return None


def served_probes(deployment: Deployment, repository: Path) -> list[Probe]:
    """The canary of every model clients call, and of its query lane where it has one, from its config.pbtxt in the
    repository."""
    probes = []
    for settings in deployment.models:
        names = deployment.names(settings)
        for model in filter(None, (names.model, names.lane_in(repository))):
            config = text_format.Parse((repository / model / "config.pbtxt").read_text(), mc.ModelConfig())
            probes.append(probe_for(config))
    return probes


def grpc_target(url: str) -> str:
    """Where the launcher reaches tritonserver's own gRPC at host:port: the loopback when it listens on every
    address."""
    host, _, port = url.rpartition(":")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '::', '') else host}:{port}"


class Canary:
    """Sends the probes every interval_s from a thread of its own. When a model has had no good answer for timeout_s
    it calls on_hang(Hang): once and ends for a hung tritonserver; for a hung model, and goes on. While paused() (a
    stub being reloaded by the watchdog, a drain) failures do not count."""

    def __init__(
        self,
        target: str,
        probes: list[Probe],
        interval_s: float,
        timeout_s: float,
        on_hang: Callable[[Hang], None],
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.probes, self.interval_s, self.timeout_s = probes, interval_s, timeout_s
        self.on_hang, self.paused = on_hang, paused
        self.metadata = list(headers(api_key(), "grpc").items())
        self._channel = grpc.insecure_channel(target, options=GRPC_CHANNEL_ARGS)
        self._infer = self._channel.unary_unary(MODEL_INFER, request_serializer=None, response_deserializer=None)
        self._statistics = self._channel.unary_unary(
            MODEL_STATISTICS,
            request_serializer=service_pb2.ModelStatisticsRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStatisticsResponse.FromString,
        )
        self._failing_since: dict[str, float] = {}  # model -> when its first failed canary of this run began
        self._answered_at_good: dict[str, int | None] = {}  # model -> its answered requests after a good canary
        self._stop = threading.Event()

    def start(self) -> Canary:
        threading.Thread(target=self._run, name="canary", daemon=True).start()
        return self

    def stop(self) -> None:
        """Ends the thread after its call in flight, which then reports nothing (never blocks the caller)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                hang = self.check()
                if hang and not self._stop.is_set():
                    self.on_hang(hang)
                    if hang.model is None:
                        return
        finally:
            self._channel.close()

    def check(self) -> Hang | None:
        """One round: every probe once; what counts as hung, or None."""
        if self.paused():
            self._failing_since.clear()
            return None
        for probe in self.probes:
            model, started = probe.model, time.monotonic()
            problem = self.attempt(probe)
            if self._stop.is_set() or self.paused():
                return None
            if problem is None:
                if self._failing_since.pop(model, None) is not None:
                    log.info(f"canary: {model} answers again")
                self._answered_at_good[model] = self.answered(model)
                continue
            since = self._failing_since.setdefault(model, started)
            failing_s = time.monotonic() - since
            if since == started:
                log.warning(f"canary: {model}: {problem}; hung if that lasts {self.timeout_s:g} s")
            if failing_s < self.timeout_s:
                continue
            limit = f"server.canary_timeout_s = {self.timeout_s:g}"
            reason = f"{model}: no good canary answer for {failing_s:.1f} s ({limit}); the last: {problem}"
            answered, before = self.answered(model), self._answered_at_good.get(model)
            if answered is None:
                return Hang(None, f"{reason}; tritonserver did not answer its statistics either")
            # A canary that waited out its deadline behind other work, while the model answered that work, is busy.
            waited = problem.startswith(grpc.StatusCode.DEADLINE_EXCEEDED.name)
            if waited and (before is None or answered > before):
                log.info(f"canary: {model} answered requests meanwhile ({before} -> {answered}): busy, not hung")
                self._failing_since[model], self._answered_at_good[model] = time.monotonic(), answered
                continue
            self._failing_since.pop(model)
            return Hang(model, f"{reason}; it answered no request since its last good canary")
        return None

    def answered(self, model: str) -> int | None:
        """How many requests `model` has answered, succeeded or failed, since it loaded; None when tritonserver does
        not say within the deadline."""
        try:
            response = self._statistics(
                service_pb2.ModelStatisticsRequest(name=model),
                timeout=min(self.timeout_s, STATISTICS_TIMEOUT_S),
                metadata=self.metadata,
            )
        except grpc.RpcError:
            return None
        return sum(s.inference_stats.success.count + s.inference_stats.fail.count for s in response.model_stats)

    def attempt(self, probe: Probe) -> str | None:
        """One canary call: what was wrong with it, or None."""
        try:
            data = self._infer(probe.request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {(exc.details() or '')[:300]}"
        try:
            return answer_problem(decode_response(data), probe.outputs)
        except (DecodeError, ValueError, KeyError) as exc:  # a response that does not parse, an unknown datatype
            return f"an answer that does not decode ({exc})"
