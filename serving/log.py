"""The log of the launcher and of both fronts: one line per event, as server.log_format asks.

    text   `component: message` (what a terminal shows; the default)
    json   one JSON object per line: time (ISO 8601, UTC, milliseconds), level, component, message, and
           request_id (and tenant, with a keys file: serving/tenants.py) where the line is about one request
           (what a log pipeline parses; the chart's default)

Errors go to stderr, the rest to stdout. Each process calls configure() once at its start; a module logs
through logging.getLogger(component), and a line about a request passes extra={"request_id": id} (and
"tenant": name, which a text line says in its message).
tritonserver's own lines are its own (ISO 8601 stamps, serving/launcher/triton_command.py).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

LOG_FORMATS = ("text", "json")


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "component": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            line["request_id"] = record.request_id
        if getattr(record, "tenant", None):
            line["tenant"] = record.tenant
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str) -> None:
    """This process's log lines in `log_format` (text or json): errors on stderr, the rest on stdout."""
    formatter = JsonLines() if log_format == "json" else logging.Formatter("%(name)s: %(message)s")
    out, err = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    out.addFilter(lambda record: record.levelno < logging.ERROR)
    err.setLevel(logging.ERROR)
    for handler in (out, err):
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [out, err]
    root.setLevel(logging.INFO)
