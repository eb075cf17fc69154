"""KServe v2 inference over HTTP with Triton's binary tensor data extension: a request body from rows of
BYTES inputs, a response body's outputs as numpy.

The body is a JSON header (its length in the Inference-Header-Content-Length header) followed by each input's
raw bytes, BYTES elements length-prefixed as on gRPC; every output is asked for as binary data, so an answer's
floats are copied once and never printed as JSON numbers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from protocol.kserve_grpc import DTYPES, bytes_tensor

HEADER_LENGTH = "Inference-Header-Content-Length"
CONTENT_TYPE = "application/octet-stream"  # not the form type, whose large bodies crash tritonserver 2.51


def infer_body(
    inputs: dict[str, Sequence[bytes]], outputs: Sequence[str], request_id: str = ""
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of POST /v2/models/<model>/infer for BYTES [rows, 1] inputs by name, each row already
    UTF-8, asking for `outputs` by name as binary data, with Triton's request id."""
    raws = [b"".join(len(data).to_bytes(4, "little") + data for data in rows) for rows in inputs.values()]
    header = {
        "inputs": [
            {"name": name, "shape": [len(rows), 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
            for (name, rows), raw in zip(inputs.items(), raws, strict=True)
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
        "parameters": {"binary_data_output": True},  # every output binary, also when none is named
    }
    if request_id:
        header["id"] = request_id
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([encoded, *raws]), {"Content-Type": CONTENT_TYPE, HEADER_LENGTH: str(len(encoded))}


def decode_infer_response(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """An answer's outputs by name (BYTES as str objects, as kserve_grpc.decode_response gives them), each the
    binary data after the JSON header of `header_length` bytes."""
    length = int(header_length or len(body))
    header = json.loads(body[:length])
    outputs, offset = {}, length
    for tensor in header["outputs"]:
        shape, size = tuple(tensor["shape"]), tensor["parameters"]["binary_data_size"]
        raw = body[offset : offset + size]
        offset += size
        if tensor["datatype"] == "BYTES":
            outputs[tensor["name"]] = bytes_tensor(raw, int(np.prod(shape)))
        else:
            outputs[tensor["name"]] = np.frombuffer(raw, dtype=DTYPES[tensor["datatype"]]).reshape(shape)
    return outputs


def error_message(body: bytes) -> str:
    """What Triton said in an error answer ({"error": "..."}), or the body as text."""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:500].decode(errors="replace")
