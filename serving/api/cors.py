"""CORS for browser callers of the API front: api.cors_allow_origins lists the origins (or "*") whose pages may
call it. A listed origin's requests get Access-Control-Allow-Origin (and may read the id and timing headers);
its preflight (OPTIONS with Access-Control-Request-Method) is answered 204 here, before the key is asked for,
as browsers send preflights without credentials. Empty (the default): no CORS headers, as before."""

from __future__ import annotations

from serving.api.request_context import TIMING_HEADERS
from serving.request_id import REQUEST_ID

PREFLIGHT = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": f"Authorization, Content-Type, {REQUEST_ID}",
    "Access-Control-Max-Age": "600",
}


def cors_headers(origin: str | None, allowed: tuple[str, ...]) -> dict[str, str]:
    """The headers a response to `origin` carries; none when the origin is not allowed (or none is)."""
    if not origin or not (origin in allowed or "*" in allowed):
        return {}
    return {
        "Access-Control-Allow-Origin": "*" if "*" in allowed else origin,
        "Vary": "Origin",
        "Access-Control-Expose-Headers": ", ".join((REQUEST_ID, *TIMING_HEADERS)),
    }


def is_preflight(method: str, headers) -> bool:
    return method == "OPTIONS" and "Access-Control-Request-Method" in headers
