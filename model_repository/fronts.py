"""What the launcher serves beside tritonserver, each started once its port is known to be free (so that a
second `make serve` names the busy port and leaves nothing behind): the HTTP front on server.http_port, the
API front's workers on api.port, and the metrics port."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from common.settings import Settings
from model_repository import api_front
from model_repository import front as http_front
from model_repository.front_workers import FrontWorkers
from model_repository.metrics_proxy import MetricsProxy
from model_repository.process_control import require_free_port

if TYPE_CHECKING:
    from model_repository.server import TritonServer


def start_front(server: TritonServer, settings: Settings) -> None:
    """The HTTP front on server.http_port, once every port is known to be free: a second `make serve` names
    the busy one and leaves nothing behind."""
    require_free_port(server.host, server.ports.http, "server.http_port")
    server.check_ports()
    front = settings.front
    arguments = http_front.command(server.host, server.ports.http, server.ports.triton_http, front.max_body_bytes)
    server.front = FrontWorkers("HTTP front", arguments, front.workers, server.host, server.ports.http)
    server.front.start()


def start_api(server: TritonServer, settings: Settings) -> None:
    """The API front's workers on ports.api, calling this server's gRPC; its /health asks the launcher's /ready."""
    ports = server.ports
    require_free_port(server.host, ports.api, "api.port")
    arguments = api_front.command(
        settings.path,
        server.repository,
        server.host,
        ports.api,
        f"127.0.0.1:{ports.grpc}",
        f"http://127.0.0.1:{ports.health}/ready",
        f"http://127.0.0.1:{ports.metrics}/metrics",
    )
    server.api = FrontWorkers("API front", arguments, settings.api.workers, server.host, ports.api).start()


def start_metrics(server: TritonServer) -> MetricsProxy:
    """The metrics port, served by the launcher so that it answers while tritonserver restarts; tritonserver's
    own metrics go to 127.0.0.1:ports.triton_metrics. Its ports are checked first, so that a busy one is
    named in the order the settings list them."""
    server.check_ports()
    metrics_host, metrics_port = server.ports.triton_metrics_address(server.host)
    proxy = MetricsProxy(server.host, server.ports.metrics, (metrics_host, metrics_port))
    print(f"launcher: {proxy.describe()}", flush=True)
    threading.Thread(target=proxy.serve_forever, name="metrics", daemon=True).start()
    return proxy
