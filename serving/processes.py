"""What every serving process shares: its children die with it, a busy port is named before anything starts,
and the error both of those raise."""

from __future__ import annotations

import ctypes
import signal
import socket


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
