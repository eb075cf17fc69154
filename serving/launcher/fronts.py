"""What the launcher starts beside tritonserver, each once its ports are known to be free (so that a second
`make serve` names the busy port and leaves nothing behind), each returned to the caller that keeps it: the
HTTP front on server.http_port, the gRPC front on server.grpc_port (with a keys file: serving/tenants.py), the
API front's workers on api.port, and the metrics port. With a keys file every front checks the tenants' keys and
shares their rates, whose buckets are named from server.grpc_port."""

from __future__ import annotations

import logging
import threading

from serving.api import app as api_front
from serving.grpc_front import proxy as grpc_front
from serving.http_front import proxy as http_front
from serving.launcher.metrics_port import MetricsProxy
from serving.launcher.tritonserver import TritonServer
from serving.processes import require_free_port
from serving.workers import FrontWorkers
from settings import Deployment

log = logging.getLogger("launcher")


def start_http_front(server: TritonServer, settings: Deployment) -> FrontWorkers:
    """The HTTP front's workers on server.http_port, before tritonserver's own HTTP on loopback."""
    require_free_port(server.host, server.ports.http, "server.http_port")
    server.check_ports()
    front = settings.front
    ports, log_format = server.ports, settings.server.log_format
    tenants = (settings.paths, settings.overrides, ports.grpc) if settings.tenants.keys_file else None
    arguments = http_front.command(
        server.host, ports.http, ports.triton_http, front.max_body_bytes, log_format, settings.tracing, tenants
    )
    return FrontWorkers("HTTP front", arguments, front.workers, server.host, server.ports.http).start()


def start_api_front(server: TritonServer, settings: Deployment) -> FrontWorkers:
    """The API front's workers on ports.api, calling this server's gRPC; its /health asks the launcher's /ready."""
    ports = server.ports
    require_free_port(server.host, ports.api, "api.port")
    # With tenants it calls tritonserver's own gRPC (it checks the keys itself), naming the server's gRPC port,
    # which names the tenants' buckets.
    overrides = [*settings.overrides, *([f"server.grpc_port={ports.grpc}"] if ports.triton_grpc else [])]
    arguments = api_front.command(
        settings.paths,
        server.repository,
        server.host,
        ports.api,
        f"127.0.0.1:{ports.triton_grpc or ports.grpc}",
        f"http://127.0.0.1:{ports.health}/ready",
        f"http://127.0.0.1:{ports.metrics}/metrics",
        overrides,
        server.board_path,
    )
    return FrontWorkers("API front", arguments, settings.api.worker_count(), server.host, ports.api).start()


def start_grpc_front(server: TritonServer, settings: Deployment) -> FrontWorkers:
    """The gRPC front's workers (front.workers, at least one) on server.grpc_port, before tritonserver's own gRPC
    on loopback: only with a keys file (ports.triton_grpc set)."""
    ports = server.ports
    require_free_port(server.host, ports.grpc, "server.grpc_port")
    arguments = grpc_front.command(server.host, ports.grpc, ports.triton_grpc, settings.paths, settings.overrides)
    workers = max(1, settings.front.workers)
    return FrontWorkers("gRPC front", arguments, workers, server.host, ports.grpc).start()


def start_metrics_port(server: TritonServer) -> MetricsProxy:
    """The metrics port, served by the launcher so that it answers while tritonserver restarts; tritonserver's
    own metrics go to 127.0.0.1:ports.triton_metrics. Its ports are checked first, so that a busy one is
    named in the order the settings list them."""
    server.check_ports()
    metrics_host, metrics_port = server.ports.triton_metrics_address(server.host)
    proxy = MetricsProxy(server.host, server.ports.metrics, (metrics_host, metrics_port))
    log.info(f"{proxy.describe()}")
    threading.Thread(target=proxy.serve_forever, name="metrics", daemon=True).start()
    return proxy
