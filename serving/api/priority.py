"""A request's class and time budget: what the caller says, else the settings' defaults ([priority]).

Class: `X-Priority: query | ingestion` (or 1 | 2), Cohere's `input_type: search_query` and every rerank call
(routes_cohere.py, routes_tei.py), else the request's shape (at most priority.query_max_texts texts is a
query). A tenant's ceiling (its keys file's max_priority) turns its queries into ingestion. A query goes to the
model's query lane, where it waits for other queries only.

Budget: `X-Request-Timeout` in seconds, or with a unit (`250ms`, `0.25s`), else the class's default
(priority.query_timeout_ms / ingestion_timeout_ms), else api.timeout_s. A request whose budget runs out is
answered 504: in the Coalescer's queue it is dropped before any Triton call; sent, its gRPC deadline passes,
and tritonserver drops a cancelled request from its queue before the stage runs it.
"""

from __future__ import annotations

import math
import re

from serving.api.request_context import RequestContext
from serving.api.schema import ApiError
from settings.schema import PRIORITY_CLASSES, PrioritySettings

PRIORITY_HEADER = "X-Priority"
TIMEOUT_HEADER = "X-Request-Timeout"
_LEVELS = {str(level): name for level, name in enumerate(PRIORITY_CLASSES, start=1)}
_BUDGET = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*")


def priority_class(value: str | None) -> str | None:
    """The class an X-Priority header names (None without one); 400 naming the header otherwise."""
    if value is None:
        return None
    name = _LEVELS.get(value.strip(), value.strip().lower())
    if name not in PRIORITY_CLASSES:
        raise ApiError(400, f"{PRIORITY_HEADER} must be one of {', '.join(PRIORITY_CLASSES)} (or 1, 2), not {value!r}")
    return name


def budget_s(value: str | None) -> float | None:
    """The seconds an X-Request-Timeout header gives (None without one); 400 naming the header otherwise."""
    if value is None:
        return None
    match = _BUDGET.fullmatch(value)
    seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1) if match else math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise ApiError(
            400, f"{TIMEOUT_HEADER} must be a time > 0 in seconds or with a unit (250ms, 0.25s), not {value!r}"
        )
    return seconds


def settle(context: RequestContext, settings: PrioritySettings, texts: int, default_budget_s: float) -> str:
    """The request's class (the caller's, else by its shape, under its tenant's ceiling), and its deadline, once:
    a request that makes several Triton calls keeps the first call's."""
    if context.priority_class is None:
        asked = context.asked_class or settings.class_of(texts)
        ceiling = PRIORITY_CLASSES.index(context.max_class)
        context.priority_class = PRIORITY_CLASSES[max(PRIORITY_CLASSES.index(asked), ceiling)]
    if context.deadline is None:
        budget = context.budget_s or settings.budget_s(context.priority_class, default_budget_s)
        context.deadline = context.started + budget
    return context.priority_class
