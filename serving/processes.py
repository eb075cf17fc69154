"""What every serving process shares: its children die with it, a busy port is named before anything starts,
the error both of those raise, and how a process that calls tritonserver on a request's path sets up grpcio."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from collections.abc import MutableMapping

# grpcio 1.85 (pinned; tritonclient 2.73's code needs >= 1.81) answers a grpc.aio call through its EventEngine:
# its poller wakes a worker thread, which reads the socket and wakes grpc.aio's own thread, which wakes the event
# loop. Without that experiment, grpc.aio's thread polls and reads the socket itself. One call at a time to
# tritonserver on 2 cores: 0.51-0.52 ms p50 and 320-326 us of the caller's CPU a call, against 0.58-0.60 ms and
# 394-404 us (docs/results/cpu-2026-12-06/grpc-poller/; grpcio 1.67.1 did not pay it).
GRPC_EXPERIMENTS = "-event_engine_client"


class ServerError(RuntimeError):
    """A server cannot be started as asked (a busy port, no tritonserver, a bad repository or interpreter)."""


def die_with_parent() -> None:
    """In a forked child: Linux sends it SIGKILL when the launcher dies, so no orphan keeps the ports
    (PR_SET_PDEATHSIG; it fires when the forking thread ends, so children are started on long-lived threads)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def require_free_port(host: str, port: int, setting: str) -> None:
    """ServerError, naming the port's setting, when something listens on host:port."""
    with socket.socket() as probe:
        # As a server binds: connections of a previous server in TIME_WAIT do not count, a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ServerError(
                f"port {port} on {host} ({setting}) is in use ({exc.strerror}): "
                "is another server running? Stop it, or choose other ports in the settings"
            ) from None


def prefer_grpc_poller(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before grpc is imported: its clients read their answers on grpcio's own poller (GRPC_EXPERIMENTS above),
    unless the process was started with GRPC_EXPERIMENTS set (even empty: grpcio's defaults)."""
    environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
