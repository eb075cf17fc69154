"""The one API key every way in asks for, when one is set: where it comes from and how a request carries it.

The key is the BERT_TRITON_API_KEY environment variable of the server's processes (the chart fills it from one
Secret), never a settings file. A request carries it as `authorization: Bearer <key>`: an HTTP header on the
API front (8080) and the HTTP front (8000); on tritonserver's gRPC (8001), where Triton's own restricted
protocol checks it for the inference group, as the metadata `triton-grpc-protocol-authorization` (Triton
prefixes the name of a restricted protocol's header so on gRPC). Health, readiness and metrics stay open.
Callers (the client, Locust, the benchmarks, the probes) read the same variable and send it when it is set.
"""

from __future__ import annotations

import hmac
import os

API_KEY_ENV = "BERT_TRITON_API_KEY"
HEADER = "authorization"  # lower case: HTTP header names match in any case, and Triton's flag names it so
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"


def api_key() -> str | None:
    """The key of this process's environment, or None when none is set (every way in is then open)."""
    return os.environ.get(API_KEY_ENV) or None


def bearer(key: str) -> str:
    """The header's value for `key`."""
    return f"Bearer {key}"


def headers(key: str | None, protocol: str = "http") -> dict[str, str]:
    """What a caller adds to each request over `protocol` (http or grpc): the header, or nothing without a key."""
    return {(GRPC_HEADER if protocol == "grpc" else HEADER): bearer(key)} if key else {}


def accepted(value: str | None, key: str) -> bool:
    """Whether a request's authorization header carries `key` (compared in constant time)."""
    scheme, _, given = (value or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())
