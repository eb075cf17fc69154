"""The launcher's supervision of tritonserver: start it, wait for it to exit, start it again after a bounded
backoff (at most server.max_restarts deaths within server.restart_window_s), and the exit status that ends
the launcher. The main thread waits in short steps, so that a signal another thread received runs its
handler (the drain) at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from model_repository.triton_install import ServerError

if TYPE_CHECKING:
    from model_repository.server import TritonServer


@dataclass
class Restarts:
    """tritonserver deaths within a sliding window: the backoff before the next start, or the end of trying."""

    max_restarts: int
    window_s: float
    total: int = 0
    recent: list = field(default_factory=list)  # time.monotonic() of each death in the window

    def record(self) -> float | None:
        """Count one death; seconds to wait before starting again, or None once it died too often."""
        now = time.monotonic()
        self.recent = [*(t for t in self.recent if now - t < self.window_s), now]
        if len(self.recent) > self.max_restarts:
            return None
        self.total += 1
        return min(2.0 ** (len(self.recent) - 1), 30.0)


def exit_status(code: int) -> int:
    """tritonserver's exit code as a shell reports it: killed by signal N gives 128 + N."""
    return 128 - code if code < 0 else code


def describe_exit(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


# The kernel hands a process's SIGTERM to any of its threads, and Python runs the handler in the main thread
# only once that thread runs Python code again: the main thread never blocks longer than this in one call.
SIGNAL_LATENCY_S = 0.2


def wait_for_exit(process: subprocess.Popen) -> int:
    while True:
        try:
            return process.wait(timeout=SIGNAL_LATENCY_S)
        except subprocess.TimeoutExpired:
            continue


def wait_for_event(event: threading.Event, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not event.wait(min(SIGNAL_LATENCY_S, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
    return True


def supervise(server: TritonServer) -> int:
    """Run tritonserver until a drain ends it, starting it again when it dies: the launcher's exit status."""
    settings = server.settings.server
    while True:
        try:
            server.start()
        except ServerError as exc:
            if server.draining:
                return 0
            if not server.was_ready:
                print(f"serve failed: {exc}", file=sys.stderr)
                return 1
            print(f"launcher: tritonserver did not come back: {exc}", flush=True)
        else:
            print(
                f"tritonserver ready: HTTP {server.host}:{server.ports.http}"
                f"{f' (front; tritonserver {server.http_url})' if server.front else ''}, "
                f"gRPC {server.grpc_url}, metrics {server.host}:{server.ports.metrics}"
                f"{f' (tritonserver 127.0.0.1:{server.ports.triton_metrics})' if server.ports.triton_metrics else ''}, "
                f"launcher /ready, /live and /metrics on {server.host}:{server.ports.health}"
                f"{f', OpenAI and TEI API on http://{server.host}:{server.ports.api}' if server.api else ''}",
                flush=True,
            )
        code = wait_for_exit(server.process)
        server.reap()
        print(f"launcher: tritonserver exited with {describe_exit(code)}", flush=True)
        if server.draining:
            return exit_status(code)
        delay = server.restarts.record()
        if delay is None:
            deaths, window = len(server.restarts.recent), settings.restart_window_s
            print(
                f"launcher: tritonserver died {deaths} times within {window:.0f} s (server.max_restarts = "
                f"{settings.max_restarts}): giving up; the last exit was {describe_exit(code)}, see its log above",
                file=sys.stderr,
                flush=True,
            )
            return exit_status(code) or 1
        print(
            f"launcher: starting tritonserver again in {delay:.0f} s (restart {len(server.restarts.recent)} of at most "
            f"{settings.max_restarts} within {settings.restart_window_s:.0f} s); /ready answers 503 meanwhile",
            flush=True,
        )
        if wait_for_event(server.stopping, delay):
            return 0
