"""TextClient / AsyncTextClient: texts in, the ensemble's outputs (embeddings, labels and scores, rerank scores, a
sparse model's non-zero entries, or a multi-vector model's token vectors) out.

Both retry a call that failed because the server was unavailable (gRPC UNAVAILABLE, HTTP 503, a Python stage
whose stub died and is being restarted, a server that is stopping) with exponential backoff and full jitter,
within one overall deadline per call, so a server restart or a stub restart is ridden out. Where nothing has
ever answered at the URL, a refused connection is given up after connect_timeout_s with a message that says
so, and a protocol that does not match the port is named. A request with more texts than the model's
max_batch_size is sent as several, its outputs put back together in order. With an API key (the api_key
argument, else BERT_TRITON_API_KEY of the environment) every inference carries it (protocol/api_key.py).
A query (priority="query", or by default a call of at most priority.query_max_texts texts) goes to the model's
query lane, `<model>-query`, where the server has one: it then waits for no ingestion batch (docs/api.md,
Priority and deadlines); priority="ingestion" keeps every call on the model itself.
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
from tritonclient.utils import InferenceServerException

from common.contract import (
    INPUT_TYPE,
    INPUT_TYPES,
    QUERY_INPUT,
    QUERY_LANE_SUFFIX,
    SCORE_OUTPUT,
    SPARSE_THRESHOLD,
    SPARSE_TOP_K,
    TEXT_INPUT,
)
from protocol.api_key import api_key as api_key_of_environment
from protocol.api_key import headers
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, TRANSIENT_MESSAGES, encode_texts
from protocol.multi_vector import token_vectors
from protocol.packed import join_outputs
from protocol.sparse import entries

PROTOCOLS = ("grpc", "http")
# CANCELLED too: this client never cancels a call itself (its deadline is DEADLINE_EXCEEDED), so a CANCELLED
# is tritonserver's gRPC server stopping with the call still in flight (a large body still arriving when a
# drained server exits): nothing was answered, and an inference is safe to send again.
RETRYABLE_STATUSES = {"StatusCode.UNAVAILABLE", "503", "UNAVAILABLE", "StatusCode.CANCELLED"}


class ClientError(RuntimeError):
    """The server answered with an error, or stayed unavailable until the deadline."""


def split_url(url: str | None, protocol: str | None) -> tuple[str | None, str]:
    """(host:port, protocol) of a URL given with or without a scheme (http://, grpc://)."""
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if not url or "://" not in url:
        return url, protocol or "grpc"
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in PROTOCOLS:
        raise ValueError(f"{url}: the scheme must be http:// or grpc:// (this client speaks no TLS), or none")
    if protocol and protocol != scheme:
        raise ValueError(f"{url} is a {scheme} URL, but the protocol asked for is {protocol}")
    return rest.rstrip("/"), scheme


def refused(exc: BaseException) -> bool:
    """Nothing listens there: the connection was refused."""
    if isinstance(exc, InferenceServerException):
        return "connection refused" in str(exc.message() or "").lower()
    return isinstance(exc, ConnectionRefusedError)


def protocol_mismatch(exc: BaseException, protocol: str, url: str) -> str | None:
    """What to say when the port speaks another protocol than the client (Triton's HTTP and gRPC ports)."""
    text = str(exc)
    if protocol == "http" and "Expected HTTP/" in text:
        return f"{url} does not answer HTTP/1.1 (it sends HTTP/2 frames): is it Triton's gRPC port? Use --protocol grpc"
    if protocol == "grpc" and "Socket closed" in text:
        return f"{url} closed the gRPC connection: is it Triton's HTTP port? Use --protocol http, or the gRPC port"
    return None


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


def text_input(module, encoded: Sequence[bytes], name: str = TEXT_INPUT):
    """A BYTES input tensor of a request (`text`, or a reranker's `query`), from texts already UTF-8."""
    data = np.array(encoded, dtype=np.object_).reshape(-1, 1)
    tensor = module.InferInput(name, list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def pair_inputs(module, encoded: Sequence[bytes], query: bytes | None) -> list:
    """The request's inputs: the texts, and a reranker's query once per text."""
    tensors = [text_input(module, encoded)]
    if query is not None:
        tensors.insert(0, text_input(module, [query] * len(encoded), QUERY_INPUT))
    return tensors


def decode_outputs(result, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The outputs the answer holds: a model may declare outputs only some requests get (an embedder's late chunks)."""
    outputs = {name: value for name in names if (value := result.as_numpy(name)) is not None}
    for name, value in outputs.items():
        if value.dtype == np.object_:
            outputs[name] = np.array([item.decode("utf-8") for item in value.reshape(-1)], dtype=object)
    return outputs


def batch_limit(config) -> int:
    """The model's max_batch_size from its config (gRPC as_json or HTTP dict); 0: the model does not batch."""
    return int((config.get("config", config)).get("max_batch_size", 0))


def chunks(items: Sequence, limit: int) -> list[Sequence]:
    return [items[i : i + limit] for i in range(0, len(items), limit)] if limit else [items]


def sparse_parameters(top_k: int | None, threshold: float | None) -> dict | None:
    """A sparse request's KServe parameters: what each text's answer keeps (None: the server's settings)."""
    given = {SPARSE_TOP_K: top_k, SPARSE_THRESHOLD: None if threshold is None else float(threshold)}
    return {name: value for name, value in given.items() if value is not None} or None


def side_parameters(input_type: str) -> dict[str, str]:
    """A multi-vector request's KServe parameters: the side its texts are encoded as; ValueError naming it."""
    if input_type not in INPUT_TYPES:
        raise ValueError(f"input_type must be one of {', '.join(INPUT_TYPES)}, not {input_type!r}")
    return {INPUT_TYPE: input_type}


def output_names(metadata) -> list[str]:
    outputs = metadata["outputs"] if isinstance(metadata, dict) else metadata.outputs
    return [item["name"] if isinstance(item, dict) else item.name for item in outputs]


def default_url(protocol: str) -> str:
    from settings import load_settings

    server = load_settings().server
    return f"{server.host}:{server.grpc_port if protocol == 'grpc' else server.http_port}"


def query_max_texts() -> int:
    """The settings' shape of a query, for a call whose priority the caller leaves to it."""
    from settings import load_settings

    return load_settings().priority.query_max_texts


class _Base:
    def __init__(
        self,
        url: str | None = None,
        protocol: str | None = None,
        model: str = "ensemble",
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        connect_timeout_s: float = 3.0,
        api_key: str | None = None,
        priority: str | None = None,
    ) -> None:
        if priority not in (None, "query", "ingestion"):
            raise ValueError(f'priority must be "query", "ingestion" or None (by the call\'s size), not {priority!r}')
        url, self.protocol = split_url(url, protocol)
        self._headers = headers(api_key or api_key_of_environment(), self.protocol)  # none without a key
        self.url = url or default_url(self.protocol)
        self.model, self.timeout_s, self.connect_timeout_s = model, timeout_s, connect_timeout_s
        self.retry = retry or RetryPolicy()
        self.priority = priority
        self._query_max_texts = query_max_texts() if priority is None else 0
        self._lane: str | None = None  # the model's query lane, once the server was asked whether it has one
        self._outputs: list[str] | None = None
        self._max_batch: int | None = None
        self._answered = False  # the server answered once: later refusals are a restart, worth riding out

    def _is_query(self, texts: int) -> bool:
        return self.priority == "query" or (self.priority is None and texts <= self._query_max_texts)

    def _target(self, texts: int) -> str:
        """The model a call of `texts` texts goes to: the query lane for a query, where the server has one."""
        return self._lane if self._is_query(texts) and self._lane else self.model

    def _ready_lane(self, ready: Callable[[str], bool]) -> str:
        """The model's query lane if the server serves it ready, else "" (a server without lanes)."""
        lane = self.model + QUERY_LANE_SUFFIX
        try:
            return lane if ready(lane) else ""
        except ClientError:  # no such model
            return ""

    def _infer_kwargs(self, remaining_s: float, parameters: dict | None = None) -> dict:
        # gRPC enforces a per-call deadline; the HTTP client's network timeout is set per connection.
        deadline = {"client_timeout": max(remaining_s, 0.001)} if self.protocol == "grpc" else {}
        extra = {"headers": self._headers} if self._headers else {}
        return {**deadline, **extra, **({"parameters": parameters} if parameters else {})}

    def _failed(self, exc: BaseException, started: float, deadline: float, delay: float | None) -> float:
        """Delay before the next try, or raise ClientError when this failure is final."""
        mismatch = None if self._answered else protocol_mismatch(exc, self.protocol, self.url)
        if mismatch:
            raise ClientError(mismatch) from exc
        if not is_retryable(exc):
            raise ClientError(str(exc)) from exc
        if refused(exc) and not self._answered and time.monotonic() - started >= self.connect_timeout_s:
            raise ClientError(
                f"nothing listens at {self.url} ({self.protocol}): is the server running (`make serve`), and is "
                f"this its {self.protocol} port? Connections were refused for {self.connect_timeout_s:.0f} s"
            ) from exc
        if delay is None or time.monotonic() + delay >= deadline:
            raise ClientError(f"server at {self.url} unavailable: {exc}") from exc
        return delay


class TextClient(_Base):
    """Blocking client. `infer(texts)` returns every output of the model by name; `embed` the embeddings;
    `rerank(query, texts)` a reranker's logit for each (query, text) pair; `embed_sparse` a sparse model's
    (indices, values) per text; `embed_multi_vector` a multi-vector model's token vectors per text."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.protocol == "grpc":
            self._module, self._json = grpcclient, {"as_json": True}
            self._client = grpcclient.InferenceServerClient(self.url, channel_args=GRPC_CHANNEL_ARGS)
        else:
            self._module, self._json = httpclient, {}
            self._client = httpclient.InferenceServerClient(
                self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )

    def _call(self, action: Callable[[float], object]):
        started = time.monotonic()
        deadline = started + self.timeout_s
        delays = self.retry.delays()
        while True:
            try:
                result = action(deadline - time.monotonic())
                self._answered = True
                return result
            except Exception as exc:
                time.sleep(self._failed(exc, started, deadline, next(delays, None)))

    def _describe(self) -> None:
        if self._outputs is None:  # set last: a concurrent call that sees it sees the whole description
            outputs = output_names(self._call(lambda _: self._client.get_model_metadata(self.model)))
            config = self._call(lambda _: self._client.get_model_config(self.model, **self._json))
            self._max_batch = batch_limit(config)
            if self.priority != "ingestion":
                self._lane = self._ready_lane(lambda lane: self._call(lambda _: self._client.is_model_ready(lane)))
            self._outputs = outputs

    def output_names(self) -> list[str]:
        self._describe()
        return self._outputs

    def infer(
        self, texts: Sequence[str], query: str | None = None, parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        """Every output by name for `texts` (and a reranker's query, paired with each; KServe request parameters);
        more texts than the model's max_batch_size go as several requests."""
        encoded = encode_texts(texts)  # a text without UTF-8 is named before anything is sent
        asked = None if query is None else encode_texts([query])[0]
        self._describe()
        model = self._target(len(encoded))
        parts = [self._infer_one(model, part, asked, parameters) for part in chunks(encoded, self._max_batch)]
        return join_outputs(parts)

    def _infer_one(
        self, model: str, encoded: Sequence[bytes], query: bytes | None = None, parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        tensors = pair_inputs(self._module, encoded, query)
        result = self._call(
            lambda remaining: self._client.infer(model, tensors, **self._infer_kwargs(remaining, parameters))
        )
        return decode_outputs(result, self._outputs)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.infer(texts)["embedding"]

    def rerank(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """A reranker's logit for each (query, text) pair, in the order of texts (a sigmoid makes it 0..1)."""
        return self.infer(texts, query)[SCORE_OUTPUT].reshape(-1)

    def embed_sparse(
        self, texts: Sequence[str], top_k: int | None = None, threshold: float | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """A sparse model's (indices, values) per text: its top_k largest entries above threshold (None: as the
        server's settings say), ascending index."""
        return entries(self.infer(texts, parameters=sparse_parameters(top_k, threshold)))

    def embed_multi_vector(self, texts: Sequence[str], input_type: str = "document") -> list[np.ndarray]:
        """A multi-vector (ColBERT) model's kept token vectors per text [its tokens, dim], fp16 views of the packed
        answer, the texts encoded as queries or documents (input_type)."""
        return token_vectors(self.infer(texts, parameters=side_parameters(input_type)))

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
            self._module, self._json = grpcclient, {"as_json": True}
            self._client = grpcclient_aio.InferenceServerClient(self.url, channel_args=GRPC_CHANNEL_ARGS)
        else:
            self._module, self._json = httpclient, {}
            self._client = httpclient_aio.InferenceServerClient(self.url, conn_timeout=self.timeout_s)

    async def _call(self, action):
        started = time.monotonic()
        deadline = started + self.timeout_s
        delays = self.retry.delays()
        while True:
            try:
                result = await asyncio.wait_for(action(deadline - time.monotonic()), deadline - time.monotonic())
                self._answered = True
                return result
            except Exception as exc:
                await asyncio.sleep(self._failed(exc, started, deadline, next(delays, None)))

    async def _describe(self) -> None:
        if self._outputs is None:  # set last: a concurrent call that sees it sees the whole description
            outputs = output_names(await self._call(lambda _: self._client.get_model_metadata(self.model)))
            config = await self._call(lambda _: self._client.get_model_config(self.model, **self._json))
            self._max_batch = batch_limit(config)
            if self.priority != "ingestion":
                lane = self.model + QUERY_LANE_SUFFIX
                try:
                    self._lane = lane if await self._call(lambda _: self._client.is_model_ready(lane)) else ""
                except ClientError:  # a server without lanes: no such model
                    self._lane = ""
            self._outputs = outputs

    async def output_names(self) -> list[str]:
        await self._describe()
        return self._outputs

    async def infer(
        self, texts: Sequence[str], query: str | None = None, parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        encoded = encode_texts(texts)
        asked = None if query is None else encode_texts([query])[0]
        await self._describe()
        model = self._target(len(encoded))
        parts = await asyncio.gather(
            *(self._infer_one(model, part, asked, parameters) for part in chunks(encoded, self._max_batch))
        )
        return join_outputs(list(parts))

    async def _infer_one(
        self, model: str, encoded: Sequence[bytes], query: bytes | None = None, parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        tensors = pair_inputs(self._module, encoded, query)
        result = await self._call(
            lambda remaining: self._client.infer(model, tensors, **self._infer_kwargs(remaining, parameters))
        )
        return decode_outputs(result, self._outputs)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return (await self.infer(texts))["embedding"]

    async def rerank(self, query: str, texts: Sequence[str]) -> np.ndarray:
        return (await self.infer(texts, query))[SCORE_OUTPUT].reshape(-1)

    async def embed_sparse(
        self, texts: Sequence[str], top_k: int | None = None, threshold: float | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        return entries(await self.infer(texts, parameters=sparse_parameters(top_k, threshold)))

    async def embed_multi_vector(self, texts: Sequence[str], input_type: str = "document") -> list[np.ndarray]:
        return token_vectors(await self.infer(texts, parameters=side_parameters(input_type)))

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncTextClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
