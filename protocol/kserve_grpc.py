"""KServe v2 ModelInfer over gRPC, as raw protobufs: a request from texts, a response's outputs as numpy.

A request carries the texts as one raw length-prefixed BYTES tensor, and a response's outputs are read from
raw_output_contents, so a call costs one protobuf encode and decode and no tritonclient wrappers. A load
generator can build a request once and send it many times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import service_pb2

from common.contract import TEXT_INPUT

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STATISTICS = "/inference.GRPCInferenceService/ModelStatistics"
# Answers that mean "not now" for a model that exists, so a retry will find it: a Python stage's stub died
# (the request never ran, and the launcher's watchdog restarts the stub within seconds), and a server that
# is shutting down has unloaded its models while its endpoints still answer.
STUB_DIED = "is not healthy"  # "Stub process '<instance>' is not healthy."
TRANSIENT_MESSAGES = (STUB_DIED, "has no available versions")
# gRPC reconnects with its own backoff (1 s, growing to 120 s by default): cap it so that a client sees a
# restarted server within ~1 s. The rest are tritonclient's defaults, which channel_args replaces.
GRPC_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
DTYPES = {"FP16": np.float16, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64}


def encode_texts(texts: Sequence[str]) -> list[bytes]:
    """UTF-8 of each text; ValueError naming the text that has none (a lone surrogate, say)."""
    if isinstance(texts, str):
        raise TypeError("pass a sequence of texts, not one str")
    if not texts:
        raise ValueError("no texts to send")
    encoded = []
    for index, text in enumerate(texts):
        try:
            encoded.append(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"text[{index}] {text[:40]!r} is not valid Unicode ({exc.reason})") from None
    return encoded


def model_infer_request(model: str, texts: Sequence[str]) -> bytes:
    """A serialized ModelInferRequest carrying `texts`, asking for every output."""
    return encoded_infer_request(model, encode_texts(texts))


def encoded_infer_request(model: str, encoded: Sequence[bytes], outputs: Sequence[str] = ()) -> bytes:
    """model_infer_request for texts already UTF-8, asking for `outputs` by name (none: all of them)."""
    return tensors_infer_request(model, {TEXT_INPUT: encoded}, outputs)


def tensors_infer_request(
    model: str,
    inputs: dict[str, Sequence[bytes]],
    outputs: Sequence[str] = (),
    request_id: str = "",
    parameters: dict[str, int | float | str] | None = None,
) -> bytes:
    """A serialized ModelInferRequest of BYTES [rows, 1] inputs by name, each row already UTF-8 (a reranker's
    query beside its text, say), asking for `outputs` by name (none: all of them), with Triton's request id and
    request parameters (a sparse model's sparse_top_k, sparse_threshold; a multi-vector model's input_type)."""
    return tensors_infer_message(model, inputs, outputs, request_id, parameters).SerializeToString()


def tensors_infer_message(
    model: str,
    inputs: dict[str, Sequence[bytes]],
    outputs: Sequence[str] = (),
    request_id: str = "",
    parameters: dict[str, int | float | str] | None = None,
) -> service_pb2.ModelInferRequest:
    """tensors_infer_request's message, before it is serialized."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, value in (parameters or {}).items():
        if isinstance(value, str):
            request.parameters[name].string_param = value
        elif isinstance(value, int):
            request.parameters[name].int64_param = value
        else:
            request.parameters[name].double_param = value
    for name, rows in inputs.items():
        request.inputs.add(name=name, datatype="BYTES", shape=[len(rows), 1])
        request.raw_input_contents.append(b"".join(len(data).to_bytes(4, "little") + data for data in rows))
    for name in outputs:
        request.outputs.add(name=name)
    return request


def _bytes_tensor(raw: bytes, count: int) -> np.ndarray:
    items, offset = [], 0
    for _ in range(count):
        size = int.from_bytes(raw[offset : offset + 4], "little")
        items.append(raw[offset + 4 : offset + 4 + size].decode("utf-8"))
        offset += 4 + size
    return np.array(items, dtype=object)


def decode_response(data: bytes) -> dict[str, np.ndarray]:
    """A serialized ModelInferResponse's outputs by name (BYTES as str objects)."""
    return decode_infer_response(service_pb2.ModelInferResponse.FromString(data))


def decode_infer_response(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """A ModelInferResponse's outputs by name (a stream's answers arrive parsed, inside ModelStreamInferResponse)."""
    outputs = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        shape = tuple(tensor.shape)
        if tensor.datatype == "BYTES":
            outputs[tensor.name] = _bytes_tensor(raw, int(np.prod(shape)))
        else:
            outputs[tensor.name] = np.frombuffer(raw, dtype=DTYPES[tensor.datatype]).reshape(shape)
    return outputs
