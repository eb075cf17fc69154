"""RequestContext: what the API front knows of the request a handler serves: its id, when it came, how long it
waited for a Triton call and how long that call took, and the tokens the model read. The guard middleware
(app.py) makes one per request; the Coalescer fills in the times of the call that carried its texts; the
response carries them as the headers TEI's clients read.

A request's id (serving/request_id.py) is echoed in the response, sent to Triton as the ModelInferRequest's
id (a coalesced call carries the ids of its requests) and put in the log lines about it.
The context lives in a context variable: aiohttp runs each request's handler in a task of its own, so
requests that share a call never see each other's.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from serving.request_id import REQUEST_ID

TIMING_HEADERS = ("x-total-time", "x-queue-time", "x-inference-time", "x-compute-tokens")


@dataclass
class RequestContext:
    id: str
    started: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # waiting in the Coalescer for a call
    inference_s: float = 0.0  # the Triton calls that carried its texts (tokenize, model, pooling, gRPC)
    tokens: int = 0
    trace: dict[str, str] = field(default_factory=dict)  # traceparent of this request's span (serving/tracing.py)
    tenant: str = ""  # the tenant its API key names (serving/tenants.py); "" without a keys file
    max_class: str = "query"  # the highest priority class its tenant may use (settings PRIORITY_CLASSES)
    asked_class: str | None = None  # the class the caller named (X-Priority, Cohere's input_type)
    budget_s: float | None = None  # the time budget the caller gave (X-Request-Timeout)
    priority_class: str | None = None  # the class it is served as, and the perf_counter() time by which it
    deadline: float | None = None  # must be answered, else 504 (serving/api/priority.py settles both)

    def headers(self) -> dict[str, str]:
        """TEI's timing headers, in whole milliseconds as TEI writes them, and the id."""
        total_ms = (time.perf_counter() - self.started) * 1000
        return {
            REQUEST_ID: self.id,
            "x-total-time": str(round(total_ms)),
            "x-queue-time": str(round(self.queue_s * 1000)),
            "x-inference-time": str(round(self.inference_s * 1000)),
            "x-compute-tokens": str(self.tokens),
        }


CURRENT: ContextVar[RequestContext | None] = ContextVar("api_request", default=None)
