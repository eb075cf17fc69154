"""The metrics port (server.metrics_port), served by the launcher: Triton's metrics with the GPUs' from NVML.

tritonserver's own metrics listen on 127.0.0.1 (Ports.triton_metrics). Each scrape fetches that text, drops
Triton's GPU families where NVML reads the GPUs (Triton's come from DCGM, which the wheel's tritonserver lacks:
they read 0) and appends NVML's (gpu_metrics.py), so every family appears once. Without NVML or a GPU, Triton's
text passes unchanged. While tritonserver is down (restarting, starting) a scrape still answers: the GPU
families alone. bert_launcher_tritonserver_metrics_up says whether Triton's part is in this scrape.
"""

from __future__ import annotations

import http.client
import re
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serving.launcher.gpu_metrics import TRITON_GPU_FAMILIES, NvmlGpus, format_readings
from serving.processes import require_free_port

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SAMPLE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def without_families(text: str, names: frozenset[str]) -> str:
    """Prometheus text without the HELP, TYPE and sample lines of the named families."""

    def family(line: str) -> str | None:
        if line.startswith(("# HELP ", "# TYPE ")):
            parts = line.split(maxsplit=3)
            return parts[2] if len(parts) > 2 else None
        match = _SAMPLE_NAME.match(line)
        return match.group(0) if match else None

    kept = [line for line in text.splitlines() if family(line) not in names]
    return "\n".join(kept) + "\n" if kept else ""


class MetricsProxy(ThreadingHTTPServer):
    """GET /metrics on host:port: tritonserver's metrics from `upstream` (host, port) plus the GPUs' (NVML)."""

    daemon_threads = True

    def __init__(
        self,
        host: str,
        port: int,
        upstream: tuple[str, int],
        gpus: NvmlGpus | None = None,
        setting: str = "server.metrics_port",
    ) -> None:
        require_free_port(host, port, setting)
        self.upstream = f"http://{upstream[0]}:{upstream[1]}/metrics"
        self.gpus = gpus if gpus is not None else NvmlGpus()
        super().__init__((host, port), _MetricsHandler)

    def describe(self) -> str:
        """One line for the launcher's log: where the GPU metrics come from, or why there are none."""
        if self.gpus.available:
            return f"GPU metrics of {len(self.gpus)} GPU(s) from NVML in place of Triton's (DCGM) nv_gpu_*"
        return f"no GPU metrics on the metrics port ({self.gpus.problem}); Triton's metrics pass unchanged"

    def triton_metrics(self) -> str | None:
        """tritonserver's metrics text, or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.upstream, timeout=5) as response:
                return response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException):  # URLError, refused, reset, timeout, a bad status line
            return None

    def metrics(self) -> str:
        triton = self.triton_metrics()
        text = ""
        if triton is not None:
            text = without_families(triton, TRITON_GPU_FAMILIES) if self.gpus.available else triton
            text += "\n" if text and not text.endswith("\n") else ""
        return (
            text
            + format_readings(self.gpus.read())
            + "# HELP bert_launcher_tritonserver_metrics_up Whether tritonserver's own metrics answered this scrape\n"
            + "# TYPE bert_launcher_tritonserver_metrics_up gauge\n"
            + f"bert_launcher_tritonserver_metrics_up {int(triton is not None)}\n"
        )


class _MetricsHandler(BaseHTTPRequestHandler):
    server: MetricsProxy

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "GET /metrics")
            return
        data = self.server.metrics().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # Prometheus scrapes every few seconds
        pass
