"""An API front worker process on a free port in front of a test server, as the launcher runs its workers, and
the sentences the API tests send (short and long, several scripts, an empty one)."""

from __future__ import annotations

from pathlib import Path

import httpx

from serving.api.app import command
from serving.launcher.triton_command import free_ports
from serving.workers import FrontWorkers
from settings import DEFAULT_SETTINGS

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome",
    "Il pleut des cordes à Paris ce matin.",
    "",
    "深度学习模型需要大量的数据。",
    "The quick brown fox jumps over the lazy dog. " * 40,  # truncated to max_tokens
]


class Front:
    """One API front worker on a free port, in front of `server_urls` (gRPC, readiness, metrics), run as the
    launcher runs its workers (FrontWorkers); it inherits this process's environment."""

    def __init__(
        self, repository: Path, server_urls: tuple[str, str, str], *overrides: str, gpu_board: Path | None = None
    ):
        (self.port,) = free_ports(1)
        grpc_url, ready_url, metrics_url = server_urls
        arguments = command(
            [DEFAULT_SETTINGS],
            repository,
            "127.0.0.1",
            self.port,
            grpc_url,
            ready_url,
            metrics_url,
            overrides,
            gpu_board,
        )
        self.workers = FrontWorkers("API front", arguments, 1, "127.0.0.1", self.port).start(timeout_s=60)
        self.url = f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=60, **kwargs)

    def stop(self) -> None:
        self.workers.stop()


def urls(server) -> tuple[str, str, str]:
    """gRPC, readiness and metrics of a test server (Triton's own readiness: no launcher runs here)."""
    return (
        server.grpc_url,
        f"http://{server.http_url}/v2/health/ready",
        f"http://127.0.0.1:{server.ports.metrics}/metrics",
    )
