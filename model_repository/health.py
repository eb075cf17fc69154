"""The launcher's own HTTP port (server.health_port): /ready, /live and /metrics.

Triton 2.51 keeps /v2/health/ready at 200 while a Python stub is dead, so probes ask the launcher, which
also knows whether it is draining and how often it restarted tritonserver, a stage or the HTTP front.
"""

from __future__ import annotations

import json
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from model_repository.process_control import require_free_port

if TYPE_CHECKING:
    from model_repository.server import TritonServer


class HealthEndpoint(ThreadingHTTPServer):
    """GET /ready (200 or 503 with the problems), /live (200 while tritonserver runs), both JSON, and /metrics
    (Prometheus text: the launcher's restarts of tritonserver and of stages)."""

    daemon_threads = True

    def __init__(self, server: TritonServer) -> None:
        self.triton = server
        require_free_port(server.host, server.ports.health, "server.health_port")
        super().__init__((server.host, server.ports.health), _HealthHandler)


def launcher_metrics(triton: TritonServer) -> str:
    stubs = Counter(triton.stub_restarts)
    if triton.watchdog:
        stubs.update(restart.model for restart in triton.watchdog.restarts)
    lines = [
        "# HELP bert_launcher_tritonserver_restarts_total Times the launcher started tritonserver again after it died",
        "# TYPE bert_launcher_tritonserver_restarts_total counter",
        f"bert_launcher_tritonserver_restarts_total {triton.restarts.total}",
        "# HELP bert_launcher_stub_restarts_total Reloads of a Python model after one of its stubs died",
        "# TYPE bert_launcher_stub_restarts_total counter",
        *(f'bert_launcher_stub_restarts_total{{model="{model}"}} {count}' for model, count in sorted(stubs.items())),
        "# HELP bert_launcher_front_restarts_total Times the launcher started a dead HTTP front worker again",
        "# TYPE bert_launcher_front_restarts_total counter",
        f"bert_launcher_front_restarts_total {triton.front.restarts if triton.front else 0}",
        "# HELP bert_launcher_ready Whether the launcher's /ready answers 200",
        "# TYPE bert_launcher_ready gauge",
        f"bert_launcher_ready {int(triton.health()[0])}",
    ]
    return "\n".join(lines) + "\n"


class _HealthHandler(BaseHTTPRequestHandler):
    server: HealthEndpoint

    def do_GET(self) -> None:
        triton = self.server.triton
        if self.path == "/metrics":
            self._send(200, launcher_metrics(triton).encode(), "text/plain; version=0.0.4")
            return
        if self.path == "/ready":
            ok, problems = triton.health()
            body = {"ready": ok, "problems": problems}
        elif self.path == "/live":
            ok = triton.process is not None and triton.process.poll() is None
            body = {"live": ok}
        else:
            self.send_error(404, "GET /ready, /live or /metrics")
            return
        body["tritonserver_restarts"] = triton.restarts.total
        if triton.watchdog and triton.watchdog.restarts:
            body["stub_restarts"] = [
                {"model": r.model, "at": r.detected_at, "seconds": r.seconds} for r in triton.watchdog.restarts
            ]
        self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # probes every few seconds would flood the log
        pass
