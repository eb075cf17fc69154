"""The launcher's own HTTP port (server.health_port): /ready, /live and /metrics.

Triton 2.51 keeps /v2/health/ready at 200 while a Python stub is dead, so probes ask the launcher, which
also knows whether it is draining and how often it restarted tritonserver, a stage or a front. What it answers
comes from a HealthSource (the Supervisor).
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from serving.processes import require_free_port


class HealthSource(Protocol):
    def ready(self) -> tuple[bool, list[str]]: ...

    def live(self) -> tuple[bool, list[str]]: ...

    def status(self) -> dict: ...

    def metrics(self) -> str: ...


class HealthEndpoint(ThreadingHTTPServer):
    """GET /ready (200 or 503 with the problems), /live (200 while tritonserver runs and answers its canaries;
    503 with the problem otherwise), both JSON, and /metrics
    (Prometheus text: the launcher's restarts of tritonserver, of stages and of fronts)."""

    daemon_threads = True

    def __init__(self, host: str, port: int, source: HealthSource) -> None:
        self.source = source
        require_free_port(host, port, "server.health_port")
        super().__init__((host, port), _HealthHandler)


class _HealthHandler(BaseHTTPRequestHandler):
    server: HealthEndpoint

    def do_GET(self) -> None:
        source = self.server.source
        if self.path == "/metrics":
            self._send(200, source.metrics().encode(), "text/plain; version=0.0.4")
            return
        if self.path == "/ready":
            ok, problems = source.ready()
            body = {"ready": ok, "problems": problems}
        elif self.path == "/live":
            ok, problems = source.live()
            body = {"live": ok, "problems": problems}
        else:
            self.send_error(404, "GET /ready, /live or /metrics")
            return
        body |= source.status()
        self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # probes every few seconds would flood the log
        pass
