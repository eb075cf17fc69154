"""The Supervisor: the one object that owns the launcher's state. It runs tritonserver and starts it again when
it dies (bounded backoff: at most server.max_restarts deaths within server.restart_window_s) or hangs (the
canary, canary.py: /live 503 with the reason, then SIGKILL, counted as a death), kills a model's stubs that hang
(the watchdog reloads them), keeps the fronts beside it in its readiness, drains on a signal, and returns the exit
status that ends the launcher. The main thread waits in short steps, so that a signal another thread received runs
its handler (the drain) at once."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from serving.launcher.canary import Canary, Hang, grpc_target, served_probes
from serving.launcher.procfs import stub_processes
from serving.launcher.tritonserver import TritonServer
from serving.processes import ServerError
from serving.workers import FrontWorkers

log = logging.getLogger("launcher")


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


class Supervisor:
    """tritonserver, the fronts beside it, and whether the launcher is draining. The health endpoint reads
    ready(), live(), status() and metrics(); the signal handler calls drain(); the main thread runs run()."""

    def __init__(self, server: TritonServer) -> None:
        settings = server.deployment.server
        self.server = server
        self.restarts = Restarts(settings.max_restarts, settings.restart_window_s)
        self.fronts: dict[str, FrontWorkers] = {}  # by the name metrics label them with: http, api
        self.draining = False
        self.stopping = threading.Event()  # set when a drain begins: ends a restart backoff at once
        self.came_up = False  # some tritonserver of this launcher came up: a later failure is a death
        self.announcement = "tritonserver ready"  # printed each time it comes up: what listens where
        self.canary: Canary | None = None  # the running tritonserver's, once it came up
        self.hang: str | None = None  # why tritonserver was found hung: /live says it until the next one starts
        self.hangs = 0
        self.stub_hangs: dict[str, int] = {}  # model -> times its stubs were found hung (then killed)

    def ready(self) -> tuple[bool, list[str]]:
        """(ready, problems): what the launcher's /ready answers."""
        problems = ["shutting down: draining in-flight requests"] if self.draining else []
        problems += self.server.problems()
        for front in self.fronts.values():
            problems += front.problems()
        return not problems, problems

    def live(self) -> tuple[bool, list[str]]:
        """(live, problems): what the launcher's /live answers: tritonserver runs and was not found hung."""
        problems = [f"tritonserver hung: {self.hang}"] if self.hang else []
        process = self.server.process
        if process is None or process.poll() is not None:
            problems.append("tritonserver is not running")
        return not problems, problems

    def status(self) -> dict:
        """What /ready and /live add to their answer: the restarts so far."""
        status: dict = {"tritonserver_restarts": self.restarts.total}
        watchdog = self.server.watchdog
        if watchdog and watchdog.restarts:
            status["stub_restarts"] = [
                {"model": r.model, "at": r.detected_at, "seconds": r.seconds} for r in watchdog.restarts
            ]
        return status

    def metrics(self) -> str:
        """The launcher's own Prometheus text: its restarts of tritonserver, of stages and of fronts."""
        stubs = self.server.stub_restarts_by_model()
        families = [
            ("tritonserver_restarts_total", "counter", "Times the launcher started tritonserver again after it died",
             [("", self.restarts.total)]),
            ("tritonserver_hangs_total", "counter", "Times the canary found tritonserver hung (then killed it)",
             [("", self.hangs)]),
            ("stub_hangs_total", "counter", "Times the canary found a model's stubs hung (then killed them)",
             [(f'{{model="{model}"}}', count) for model, count in sorted(self.stub_hangs.items())]),
            ("stub_restarts_total", "counter", "Reloads of a Python model after one of its stubs died",
             [(f'{{model="{model}"}}', count) for model, count in sorted(stubs.items())]),
            ("front_restarts_total", "counter", "Times the launcher started a dead front worker again",
             [(f'{{front="{name}"}}', front.restarts) for name, front in self.fronts.items()]),
            ("ready", "gauge", "Whether the launcher's /ready answers 200", [("", int(self.ready()[0]))]),
        ]  # fmt: skip
        lines = []
        for name, kind, text, samples in families:
            lines += [f"# HELP bert_launcher_{name} {text}", f"# TYPE bert_launcher_{name} {kind}"]
            lines += [f"bert_launcher_{name}{labels} {value}" for labels, value in samples]
        return "\n".join(lines) + "\n"

    def drain(self) -> None:
        """Readiness 503 at once and no more restarts, then tritonserver's shut_down (the requests in flight
        finish first). Called from a signal handler's thread; a second call does nothing more."""
        if self.draining:
            return
        self.draining = True
        self.stopping.set()
        if self.canary:
            self.canary.stop()
        api = self.fronts.get("api")
        self.server.shut_down(before_sigterm=api.stop if api else None)

    def start_canary(self) -> None:
        """The canary of the tritonserver that just came up (none while server.canary_interval_s is 0)."""
        server, settings = self.server, self.server.deployment.server
        if settings.canary_interval_s <= 0 or self.draining:
            return
        process = server.process

        def on_hang(hang: Hang) -> None:
            if self.draining or server.process is not process:
                return
            # A model's hung stubs are killed for the watchdog to reload; a Triton ensemble has none of its own.
            stubs = stub_processes(process.pid).get(hang.model, []) if hang.model else []
            if stubs:
                self.stub_hangs[hang.model] = self.stub_hangs.get(hang.model, 0) + 1
                log.error(f"{hang.model}'s stubs are hung: {hang.reason}; SIGKILL {stubs}, the watchdog reloads it")
                for pid in stubs:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return
            self.hang, self.hangs = hang.reason, self.hangs + 1
            log.error(f"tritonserver is hung: {hang.reason}; SIGKILL, then it is started again as after a crash")
            process.kill()

        def paused() -> bool:  # a model whose stub the watchdog reloads fails meanwhile: that is the watchdog's
            return self.draining or bool(server.watchdog and server.watchdog.problems())

        probes = served_probes(server.deployment, server.repository)
        target = grpc_target(server.grpc_url)  # its own, behind the gRPC front when there is one
        self.canary = Canary(
            target, probes, settings.canary_interval_s, settings.canary_timeout_s, on_hang, paused
        ).start()

    def run(self) -> int:
        """Run tritonserver until a drain ends it, starting it again when it dies: the launcher's exit status."""
        server, settings = self.server, self.server.deployment.server
        while True:
            self.hang = None
            try:
                server.start()
            except ServerError as exc:
                if self.draining:
                    return 0
                if not self.came_up:
                    log.error(f"serve failed: {exc}")
                    return 1
                log.info(f"tritonserver did not come back: {exc}")
            else:
                self.came_up = True
                log.info(self.announcement)
                self.start_canary()
            code = wait_for_exit(server.process)
            if self.canary:
                self.canary.stop()
                self.canary = None
            server.reap()
            if server.left_a_dead_version:
                log.info("tritonserver stopped by the drain: nothing but a dead stub's model version was left")
            else:
                log.info(f"tritonserver exited with {describe_exit(code)}")
            if self.draining:  # a drain that left tritonserver nothing but a dead stub's version is a clean stop
                return 0 if server.left_a_dead_version else exit_status(code)
            delay = self.restarts.record()
            if delay is None:
                deaths, window = len(self.restarts.recent), settings.restart_window_s
                log.error(
                    f"tritonserver died {deaths} times within {window:.0f} s (server.max_restarts = "
                    f"{settings.max_restarts}): giving up; the last exit was {describe_exit(code)}, see its log above"
                )
                return exit_status(code) or 1
            log.warning(
                f"starting tritonserver again in {delay:.0f} s (restart {len(self.restarts.recent)} of at "
                f"most {settings.max_restarts} within {settings.restart_window_s:.0f} s); /ready answers 503 meanwhile"
            )
            if wait_for_event(self.stopping, delay):
                return 0
