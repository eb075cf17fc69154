"""TextClient / AsyncTextClient: texts in, the ensemble's outputs (embeddings, or labels and scores) out.

Both retry a call that failed because the server was unavailable (connection refused or reset, gRPC
UNAVAILABLE, HTTP 503, a Python stage whose stub died and is being restarted) with exponential backoff and
full jitter, within one overall deadline per call, so a server restart or a stub restart is ridden out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

PROTOCOLS = ("grpc", "http")
RETRYABLE_STATUSES = {"StatusCode.UNAVAILABLE", "503", "UNAVAILABLE"}
# Answers that mean "not now" for a model that exists, so a retry will find it: a Python stage's stub died
# (the request never ran, and the launcher's watchdog restarts the stub within seconds), and a server that
# is shutting down has unloaded its models while its endpoints still answer.
TRANSIENT_MESSAGES = ("is not healthy", "has no available versions")
# gRPC reconnects with its own backoff (1 s, growing to 120 s by default): cap it so that a client sees a
# restarted server within ~1 s. The rest are tritonclient's defaults, which channel_args replaces.
GRPC_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class ClientError(RuntimeError):
    """The server answered with an error, or stayed unavailable until the deadline."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int | None = None  # total tries, the first included; None: as many as the deadline allows
    base_delay_s: float = 0.05
    max_delay_s: float = 1.0

    def delays(self) -> Iterator[float]:
        attempt = 0
        while self.attempts is None or attempt < self.attempts - 1:
            yield random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt, 30)))
            attempt += 1


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        message = str(exc.message() or "")
        transient = any(text in message for text in TRANSIENT_MESSAGES)
        return status in RETRYABLE_STATUSES or "failed to connect" in message.lower() or transient
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def model_infer_request(model: str, texts: Sequence[str]) -> bytes:
    """A serialized KServe v2 gRPC ModelInferRequest carrying `texts`: what TextClient sends, as bytes that a
    load generator can build once and send many times (loadtest/locustfile.py, bench/cpu_throughput.py)."""
    content = b"".join(len(data).to_bytes(4, "little") + data for data in (text.encode() for text in texts))
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts), 1])
    request.raw_input_contents.append(content)
    return request.SerializeToString()


MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def text_input(module, texts: Sequence[str]):
    if isinstance(texts, str):
        raise TypeError("pass a sequence of texts, not one str")
    if not texts:
        raise ValueError("no texts to send")
    data = np.array([text.encode("utf-8") for text in texts], dtype=np.object_).reshape(-1, 1)
    tensor = module.InferInput("text", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def decode_outputs(result, names: Sequence[str]) -> dict[str, np.ndarray]:
    outputs = {name: result.as_numpy(name) for name in names}
    for name, value in outputs.items():
        if value is not None and value.dtype == np.object_:
            outputs[name] = np.array([item.decode("utf-8") for item in value.reshape(-1)], dtype=object)
    return outputs


def output_names(metadata) -> list[str]:
    outputs = metadata["outputs"] if isinstance(metadata, dict) else metadata.outputs
    return [item["name"] if isinstance(item, dict) else item.name for item in outputs]


def default_url(protocol: str) -> str:
    from model_repository.settings import load_settings

    server = load_settings().server
    return f"{server.host}:{server.grpc_port if protocol == 'grpc' else server.http_port}"


class _Base:
    def __init__(
        self,
        url: str | None = None,
        protocol: str = "grpc",
        model: str = "ensemble",
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}")
        self.url = url or default_url(protocol)
        self.protocol, self.model, self.timeout_s = protocol, model, timeout_s
        self.retry = retry or RetryPolicy()
        self._outputs: list[str] | None = None

    def _infer_kwargs(self, remaining_s: float) -> dict:
        # gRPC enforces a per-call deadline; the HTTP client's network timeout is set per connection.
        return {"client_timeout": max(remaining_s, 0.001)} if self.protocol == "grpc" else {}

    def _failed(self, exc: BaseException, deadline: float, delay: float | None) -> float:
        """Delay before the next try, or raise ClientError when this failure is final."""
        if not is_retryable(exc):
            raise ClientError(str(exc)) from exc
        if delay is None or time.monotonic() + delay >= deadline:
            raise ClientError(f"server at {self.url} unavailable: {exc}") from exc
        return delay


class TextClient(_Base):
    """Blocking client. `infer(texts)` returns every ensemble output by name; `embed` the embeddings."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.protocol == "grpc":
            self._module = grpcclient
            self._client = grpcclient.InferenceServerClient(self.url, channel_args=GRPC_CHANNEL_ARGS)
        else:
            self._module = httpclient
            self._client = httpclient.InferenceServerClient(
                self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )

    def _call(self, action: Callable[[float], object]):
        deadline = time.monotonic() + self.timeout_s
        delays = self.retry.delays()
        while True:
            try:
                return action(deadline - time.monotonic())
            except Exception as exc:
                time.sleep(self._failed(exc, deadline, next(delays, None)))

    def output_names(self) -> list[str]:
        if self._outputs is None:
            metadata = self._call(lambda _: self._client.get_model_metadata(self.model))
            self._outputs = output_names(metadata)
        return self._outputs

    def infer(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        names = self.output_names()
        tensor = text_input(self._module, texts)
        result = self._call(lambda remaining: self._client.infer(self.model, [tensor], **self._infer_kwargs(remaining)))
        return decode_outputs(result, names)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.infer(texts)["embedding"]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TextClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncTextClient(_Base):
    """asyncio client with the same calls as TextClient, awaited."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.protocol == "grpc":
            self._module = grpcclient
            self._client = grpcclient_aio.InferenceServerClient(self.url, channel_args=GRPC_CHANNEL_ARGS)
        else:
            self._module = httpclient
            self._client = httpclient_aio.InferenceServerClient(self.url, conn_timeout=self.timeout_s)

    async def _call(self, action):
        deadline = time.monotonic() + self.timeout_s
        delays = self.retry.delays()
        while True:
            try:
                return await asyncio.wait_for(action(deadline - time.monotonic()), deadline - time.monotonic())
            except Exception as exc:
                await asyncio.sleep(self._failed(exc, deadline, next(delays, None)))

    async def output_names(self) -> list[str]:
        if self._outputs is None:
            self._outputs = output_names(await self._call(lambda _: self._client.get_model_metadata(self.model)))
        return self._outputs

    async def infer(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        names = await self.output_names()
        tensor = text_input(self._module, texts)
        result = await self._call(
            lambda remaining: self._client.infer(self.model, [tensor], **self._infer_kwargs(remaining))
        )
        return decode_outputs(result, names)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return (await self.infer(texts))["embedding"]

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncTextClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
