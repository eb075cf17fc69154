"""The liveness canary: one short inference per served model, so that a tritonserver that hangs without exiting
is found and restarted.

Triton 2.51 can hang without exiting (seen: a SIGSEGV under its own tracing, then no answers and no exit) while
/v2/health/ready stays 200 and every call runs into its deadline; only a real inference tells. Every
server.canary_interval_s, the Canary sends each client-facing model one short text (and a reranker's query)
through tritonserver's own gRPC, with a deadline of server.canary_timeout_s; a model with a query lane
([priority]) through its lane, which ingestion never fills, so that seconds of ingestion queued in the model's
own queue are not taken for a hang (a stub of the model itself that hangs while tritonserver answers is not
seen: the watchdog sees one that dies). An answer passes when it has every output the model's config
promises (its task's: an embedding of the served width, a reranker's score, ...), of that shape, with finite
values. A model whose canaries fail (an error, a wrong answer, no answer, a model not ready) for
canary_timeout_s is hung: on_hang gets the reason, and the Supervisor (supervision.py) kills tritonserver.
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

from common.contract import CHUNK_COUNTS, CHUNK_EMBEDDINGS, TOKENS_OUTPUT
from protocol.api_key import api_key, headers
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, decode_response, tensors_infer_request
from settings import Deployment

log = logging.getLogger("launcher")

CANARY_TEXT = "Liveness canary."
# Outputs a request must ask for by a parameter (an embedder's late chunks): not part of every answer.
ON_REQUEST_OUTPUTS = (CHUNK_EMBEDDINGS, CHUNK_COUNTS)
DTYPES = {mc.TYPE_FP32: np.float32, mc.TYPE_INT32: np.int32, mc.TYPE_INT64: np.int64, mc.TYPE_STRING: object}


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
    the config's for one text, a value that is not finite, or a token count below one."""
    for name, (dtype, dims) in outputs.items():
        if name not in answer:
            return f"no {name} output"
        array = answer[name]
        if array.dtype != np.dtype(dtype):
            return f"{name} is {array.dtype}, not {np.dtype(dtype)}"
        shape_ok = len(array.shape) == len(dims) + 1 and array.shape[0] == 1
        if not shape_ok or any(want not in (-1, got) for want, got in zip(dims, array.shape[1:], strict=True)):
            return f"{name} has shape {list(array.shape)}, not [1, {', '.join(map(str, dims))}]"
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"{name} has values that are not finite"
        if name == TOKENS_OUTPUT and array.min(initial=1) < 1:
            return f"{name} counts {array.min()} tokens"
    return None


def served_probes(deployment: Deployment, repository: Path) -> list[Probe]:
    """The canary of every model clients call (through its query lane where it has one), from its config.pbtxt
    in the repository."""
    probes = []
    for settings in deployment.models:
        names = deployment.names(settings)
        model = names.lane_in(repository) or names.model
        config = text_format.Parse((repository / model / "config.pbtxt").read_text(), mc.ModelConfig())
        probes.append(probe_for(config))
    return probes


def grpc_target(url: str) -> str:
    """Where the launcher reaches tritonserver's own gRPC at host:port: the loopback when it listens on every
    address."""
    host, _, port = url.rpartition(":")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '::', '') else host}:{port}"


class Canary:
    """Sends the probes every interval_s from a thread of its own; calls on_hang(reason) once and ends when a
    model has had no good answer for timeout_s. While paused() (a stub being reloaded by the watchdog, a drain)
    failures do not count."""

    def __init__(
        self,
        target: str,
        probes: list[Probe],
        interval_s: float,
        timeout_s: float,
        on_hang: Callable[[str], None],
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.probes, self.interval_s, self.timeout_s = probes, interval_s, timeout_s
        self.on_hang, self.paused = on_hang, paused
        self.metadata = list(headers(api_key(), "grpc").items())
        self._channel = grpc.insecure_channel(target, options=GRPC_CHANNEL_ARGS)
        self._infer = self._channel.unary_unary(MODEL_INFER, request_serializer=None, response_deserializer=None)
        self._failing_since: dict[str, float] = {}  # model -> when its first failed canary of this run began
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
                reason = self.check()
                if reason and not self._stop.is_set():
                    self.on_hang(reason)
                    return
        finally:
            self._channel.close()

    def check(self) -> str | None:
        """One round: every probe once; the reason a model counts as hung, or None."""
        if self.paused():
            self._failing_since.clear()
            return None
        for probe in self.probes:
            started = time.monotonic()
            problem = self.attempt(probe)
            if self._stop.is_set() or self.paused():
                return None
            if problem is None:
                if self._failing_since.pop(probe.model, None) is not None:
                    log.info(f"canary: {probe.model} answers again")
                continue
            since = self._failing_since.setdefault(probe.model, started)
            failing_s = time.monotonic() - since
            if failing_s >= self.timeout_s:
                limit = f"server.canary_timeout_s = {self.timeout_s:g}"
                return f"{probe.model}: no good canary answer for {failing_s:.1f} s ({limit}); the last: {problem}"
            if since == started:
                log.warning(f"canary: {probe.model}: {problem}; hung if that lasts {self.timeout_s:g} s")
        return None

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
