"""python -m serving.launcher: run NVIDIA's real tritonserver (from the nvidia-pytriton wheel) and what listens
beside it, supervised.

The launcher stays tritonserver's parent: it starts tritonserver again when it dies (bounded backoff, at most
server.max_restarts within server.restart_window_s, then it exits non-zero), restarts a Python stage whose
stub died (watchdog.py), serves /ready, /live and /metrics on server.health_port (ready = Triton ready, every
stub alive, not shutting down), and on SIGTERM or SIGINT drains: /ready turns 503 at once, Triton keeps
serving until no request has completed for a second (at most server.exit_timeout_s), then gets SIGTERM and
has that again, plus server.unload_s_per_stub per Python stub, to finish (Deployment.triton_exit_timeout_s).
tritonserver runs in a session of its own, so a Ctrl-C in the terminal reaches the launcher alone (which
drains); what it leaves when it exits (stubs, shared memory) goes, and so do the stubs of a killed launcher
(orphan_reaper.py).

In order: the settings and the repository are checked, stale shared memory is removed, the health port opens
(503 until Triton is up), the HTTP front, the metrics port and the API front start (fronts.py), and the
Supervisor (supervision.py) runs tritonserver (tritonserver.py) until a drain ends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from serving.launcher.fronts import start_api_front, start_grpc_front, start_http_front, start_metrics_port
from serving.launcher.health import HealthEndpoint
from serving.launcher.shm import remove_orphaned_shm
from serving.launcher.supervision import Supervisor
from serving.launcher.triton_command import Ports, free_port_besides
from serving.launcher.tritonserver import TritonServer
from serving.log import LOG_FORMATS, configure
from serving.processes import ServerError
from serving.tenants import KeysError, read_keys
from settings import SettingsError, load_deployment

log = logging.getLogger("launcher")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving.launcher", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", nargs="+", default=[], help="settings file(s), one per model (default: settings/defaults.toml)"
    )
    parser.add_argument("--repository", type=Path, help="model repository (default: from the settings)")
    parser.add_argument("--host", help="bind address (default: server.host from the settings)")
    for name in ("http", "grpc", "metrics", "health"):
        parser.add_argument(f"--{name}-port", type=int, help=f"default: server.{name}_port from the settings")
    parser.add_argument("--triton-http-port", type=int, help="default: front.triton_http_port from the settings")
    parser.add_argument("--api-port", type=int, help="the API front's; 0: none (default: api.port from the settings)")
    parser.add_argument(
        "--triton-metrics-port", type=int, help="tritonserver's own metrics on 127.0.0.1 (default: a free port)"
    )
    parser.add_argument(
        "--triton-grpc-port",
        type=int,
        help="with a keys file, tritonserver's own gRPC on 127.0.0.1 (default: a free port)",
    )
    parser.add_argument(
        "--gpu-board",
        type=Path,
        help="the GPU board's file (common/gpu_board.py), where a GPU model has a query lane: kept at exit, so that an "
        "API front in another container of the pod reads the same board (the chart); default: a new one",
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="default: server.log_format from the settings")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    return parser.parse_args(argv)


def announcement(server: TritonServer, http_front: bool, api_front: bool) -> str:
    """What the launcher prints each time tritonserver comes up: what listens where."""
    ports, host = server.ports, server.host
    parts = [
        f"HTTP {host}:{ports.http}" + (f" (front; tritonserver {server.http_url})" if http_front else ""),
        f"gRPC {host}:{ports.grpc}" + (f" (front; tritonserver {server.grpc_url})" if ports.triton_grpc else ""),
        f"metrics {host}:{ports.metrics}"
        + (f" (tritonserver 127.0.0.1:{ports.triton_metrics})" if ports.triton_metrics else ""),
        f"launcher /ready, /live and /metrics on {host}:{ports.health}",
    ]
    if api_front:
        parts.append(f"OpenAI and TEI API on http://{host}:{ports.api}")
    return "tritonserver ready: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure("text")  # until the settings say otherwise: a refused settings file is said as text
    try:
        overrides = [*args.set, *([f'server.log_format="{args.log_format}"'] if args.log_format else [])]
        settings = load_deployment(args.settings, overrides)
        configure(settings.server.log_format)
        defaults = Ports.of(settings)
        names = ("http", "grpc", "metrics", "health", "triton_http")
        ports = Ports(*(getattr(args, f"{n}_port") or getattr(defaults, n) for n in names))
        ports = dataclasses.replace(ports, api=defaults.api if args.api_port is None else args.api_port)
        taken = set(dataclasses.astuple(ports))  # chosen, maybe not bound yet: never Triton's metrics port too
        ports = dataclasses.replace(ports, triton_metrics=args.triton_metrics_port or free_port_besides(taken))
        if settings.tenants.keys_file:  # the gRPC front takes server.grpc_port (serving/grpc_front)
            if not ports.triton_http:
                raise SettingsError("tenants.keys_file needs the HTTP front (front.workers >= 1) to check keys on HTTP")
            read_keys(settings.tenants.keys_file)  # a wrong file is said here, before anything starts
            taken.add(ports.triton_metrics)
            ports = dataclasses.replace(ports, triton_grpc=args.triton_grpc_port or free_port_besides(taken))
        server = TritonServer(settings, args.repository, ports, args.host, console_log=True, gpu_board=args.gpu_board)
        server.command()  # refuse a bad repository or stub interpreter before anything starts
    except (SettingsError, ServerError, KeysError) as exc:
        log.error(f"serve failed: {exc}")
        return 1
    supervisor = Supervisor(server)

    def on_signal(signum, _frame) -> None:
        log.info(f"{signal.Signals(signum).name}: draining")
        threading.Thread(target=supervisor.drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    removed = remove_orphaned_shm()
    if removed:
        log.info(f"removed {len(removed)} shared-memory regions that dead stubs left in /dev/shm")
    # Outlives a SIGKILL of this process, to end the stubs that cannot end themselves (orphan_reaper.py).
    reaper = [sys.executable, "-m", "serving.launcher.orphan_reaper", str(os.getpid()), str(server.repository)]
    subprocess.Popen(reaper, stdin=subprocess.DEVNULL, start_new_session=True)
    try:  # the launcher's own port first: /ready says 503 until Triton is up
        health = HealthEndpoint(server.host, ports.health, supervisor)
    except ServerError as exc:
        log.error(f"serve failed: {exc}")
        return 1
    threading.Thread(target=health.serve_forever, name="health", daemon=True).start()
    metrics = None
    try:
        try:
            if ports.triton_http:
                supervisor.fronts["http"] = start_http_front(server, settings)
            if ports.triton_grpc:
                supervisor.fronts["grpc"] = start_grpc_front(server, settings)
            metrics = start_metrics_port(server)
            if ports.api:
                supervisor.fronts["api"] = start_api_front(server, settings)
        except RuntimeError as exc:  # a busy port (ServerError), or a front that did not come up
            log.error(f"serve failed: {exc}")
            return 1
        supervisor.announcement = announcement(server, "http" in supervisor.fronts, "api" in supervisor.fronts)
        return supervisor.run()
    finally:
        for front in reversed(supervisor.fronts.values()):
            front.stop()
        if metrics:
            metrics.shutdown()
        health.shutdown()


if __name__ == "__main__":
    sys.exit(main())
