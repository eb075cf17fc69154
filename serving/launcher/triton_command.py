"""tritonserver's ports and command line, as the launcher starts it (and the chart's object-store mode repeats)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from protocol.api_key import HEADER, bearer
from serving.launcher.watchdog import ADMIN_HEADER
from settings import Deployment, Settings
from settings.schema import TracingSettings

# Python backend shared-memory pool per model instance: large enough for a full dynamic batch of
# token ids and embeddings without growing it request by request.
SHM_DEFAULT_BYTES = 16 * 1024 * 1024
# Without GPUs for the encoder, Triton need not look for CUDA at all: no pinned host memory pool, no CUDA memory
# pool, no GPU metrics. A CPU machine's log then holds no CUDA or NVML errors a newcomer reads as failures.
CPU_ONLY_FLAGS = (
    "--pinned-memory-pool-byte-size=0",
    "--cuda-memory-pool-byte-size=0:0",
    "--allow-gpu-metrics=false",
)


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int
    health: int = 0  # the launcher's /ready and /live; 0: not served
    triton_http: int = 0  # tritonserver's own HTTP on 127.0.0.1 behind the HTTP front on `http`; 0: no front
    # tritonserver's own metrics on 127.0.0.1 behind the launcher's metrics proxy on `metrics` (metrics_port.py);
    # 0: tritonserver's metrics on host:metrics themselves
    triton_metrics: int = 0
    api: int = 0  # the launcher's API front (serving/api), OpenAI- and TEI-compatible; 0: none
    # tritonserver's own gRPC on 127.0.0.1 behind the gRPC front on `grpc` (tenants.keys_file set; the launcher
    # picks a free port unless --triton-grpc-port names one); 0: tritonserver's gRPC on host:grpc
    triton_grpc: int = 0

    @classmethod
    def free(cls) -> Ports:
        """Ports nothing listens on now (for tests and benchmarks beside a running server), triton_metrics 0:
        a TritonServer started on them serves its own metrics on `metrics`; the launcher picks triton_metrics."""
        ports = free_ports(6)
        return cls(*ports[:5], api=ports[5])

    @classmethod
    def of(cls, settings: Settings | Deployment) -> Ports:
        server = settings.server
        triton_http = settings.front.triton_http_port if settings.front.workers else 0
        return cls(
            server.http_port,
            server.grpc_port,
            server.metrics_port,
            server.health_port,
            triton_http,
            api=settings.api.port,
        )

    def triton_http_address(self, host: str) -> tuple[str, int]:
        """Where tritonserver's own HTTP listens: on loopback behind the front, else on host:http."""
        return ("127.0.0.1", self.triton_http) if self.triton_http else (host, self.http)

    def triton_grpc_address(self, host: str) -> tuple[str, int]:
        """Where tritonserver's own gRPC listens: on loopback behind the gRPC front, else on host:grpc."""
        return ("127.0.0.1", self.triton_grpc) if self.triton_grpc else (host, self.grpc)

    def triton_metrics_address(self, host: str) -> tuple[str, int]:
        """Where tritonserver's own metrics listen: on loopback behind the launcher's proxy, else on host:metrics."""
        return ("127.0.0.1", self.triton_metrics) if self.triton_metrics else (host, self.metrics)


def free_port_besides(taken: set[int]) -> int:
    """A port nothing listens on now and not among `taken`: ports chosen for this server but not yet bound
    are free to the kernel too, and it hands them out again."""
    while (port := free_ports(1)[0]) in taken:
        pass
    return port


def free_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listens on now."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def server_command(
    binary: Path,
    repository: Path,
    backends: Path,
    ports: Ports,
    host: str,
    exit_timeout_s: int,
    admin_key: str | None = None,
    uses_gpus: bool = False,
    api_key: str | None = None,
    tracing: TracingSettings | None = None,
    rate_limited: bool = False,
) -> list[str]:
    """tritonserver's flags; with admin_key, explicit model control so that the watchdog can reload a stage,
    and the repository API this opens restricted to requests carrying that per-launch key; with api_key (the
    API key, protocol/api_key.py), inference over HTTP and gRPC restricted to requests carrying it; with a
    tracing endpoint, OpenTelemetry traces of every request (serving/tracing.py); rate_limited, the rate limiter
    that honours the instance priorities of encoder.warm_first (without resources it holds nothing back)."""
    inference = f"inference:{HEADER}={bearer(api_key)}" if api_key else None
    control = [
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-restricted-api=model-repository:{ADMIN_HEADER}={admin_key}",
        f"--grpc-restricted-protocol=model-repository:{ADMIN_HEADER}={admin_key}",
    ]
    http_host, http_port = ports.triton_http_address(host)
    metrics_host, metrics_port = ports.triton_metrics_address(host)
    grpc_host, grpc_port = ports.triton_grpc_address(host)
    return [
        str(binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--http-address={http_host}",
        f"--http-port={http_port}",
        f"--grpc-address={grpc_host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={metrics_host}",
        f"--metrics-port={metrics_port}",
        f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
        "--strict-readiness=true",
        f"--exit-timeout-secs={exit_timeout_s}",
        "--log-verbose=0",
        "--log-format=ISO8601",
        *(control if admin_key else []),
        *(trace_flags(tracing) if tracing and tracing.endpoint and tracing.triton_spans else []),
        *([f"--http-restricted-api={inference}", f"--grpc-restricted-protocol={inference}"] if inference else []),
        *(CPU_ONLY_FLAGS if not uses_gpus else []),
        *(["--rate-limit=execution_count"] if rate_limited else []),
    ]


def trace_flags(tracing: TracingSettings) -> list[str]:
    """tritonserver's OpenTelemetry tracing towards the fronts' collector. Triton joins the trace of a request
    whose context came with it, and samples 1 in `rate` of those without (a traceparent's flag aside)."""
    rate = max(1, round(1 / tracing.sample_rate))
    return [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url={tracing.endpoint.rstrip('/')}/v1/traces",
        f"--trace-config=opentelemetry,resource=service.name={tracing.service_name}-triton",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=rate={rate}",
    ]
