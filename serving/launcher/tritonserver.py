"""TritonServer: one tritonserver child process, from its command line to its exit.

start() runs it (where it comes from and what is checked first: triton_install.py; its flags:
triton_command.py) and waits until the ensemble is ready, then runs a StubWatchdog (watchdog.py) that reloads
a stage whose stub died; problems() says what keeps it from serving; shut_down() lets the requests in flight
finish before Triton gets SIGTERM; reap() ends what it leaves behind (stubs, shared memory). Whether it is
started again after it dies, and whether the launcher is draining, is the Supervisor's (supervision.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from common.contract import engine_process_files
from common.gpu_board import BOARD_ENVIRONMENT
from protocol.api_key import api_key
from serving.launcher.procfs import stubs, stubs_cpu_s
from serving.launcher.shm import remove_regions
from serving.launcher.triton_command import Ports, server_command
from serving.launcher.triton_install import (
    check_stub_python,
    check_tensorrt_plans,
    prebuilt_triton,
    prepare_backends,
    stub_environment,
    triton_home,
)
from serving.launcher.watchdog import StubWatchdog
from serving.processes import ServerError, die_with_parent, require_free_port
from settings import Deployment, Settings

log = logging.getLogger("launcher")

# CPU seconds the stubs may use while the server counts as idle (the metrics threads wake once a second).
STUB_BUSY_CPU_S = 0.02


def between_steps(steps: list[str], counts: dict[str, tuple[int, int]]) -> int:
    """Requests an ensemble step passed on that the next step has not finished (queued or running there),
    from (succeeded, failed) counts per model."""
    zero = (0, 0)
    return sum(counts.get(a, zero)[0] - sum(counts.get(b, zero)) for a, b in itertools.pairwise(steps))


def model_configs(repository: Path) -> list:
    """Every model's config.pbtxt in the repository, parsed (ModelConfig messages), by model name."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    return [text_format.Parse(path.read_text(), mc.ModelConfig()) for path in sorted(repository.glob("*/config.pbtxt"))]


def ensemble_steps(repository: Path) -> list[list[str]]:
    """The step models of every Triton ensemble in the repository, each in data-path order."""
    configs = model_configs(repository)
    return [[step.model_name for step in c.ensemble_scheduling.step] for c in configs if c.platform == "ensemble"]


def board_path() -> Path:
    """A new GPU board's file: in shared memory where there is some."""
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return folder / f"bert-triton-gpu-board-{os.getpid()}-{secrets.token_hex(4)}"


class TritonServer:
    """A tritonserver child process; `with TritonServer(...) as server:` waits until the ensemble is ready.

    Once ready, a StubWatchdog restarts a stage whose stub died (server.watchdog_interval_s > 0)."""

    def __init__(
        self,
        settings: Settings | Deployment,
        repository: Path | None = None,
        ports: Ports | None = None,
        host: str | None = None,
        work_dir: Path | None = None,
        console_log: bool = False,
        gpu_board: Path | None = None,
    ) -> None:
        """work_dir (default: the settings' build dir) holds the prepared backends folder and the log, so
        several servers can run side by side from one settings object; with console_log Triton logs to
        this process's stdout instead (the launcher: container logs, read-only root filesystem). gpu_board: the
        GPU board's file, where the server takes GPU turns, kept when it stops (an API front in another
        container reads it); else a new one, removed when it stops."""
        self.settings = settings  # as given: one model's Settings, or the Deployment of several
        self.deployment = Deployment.of(settings)
        self.repository = repository or self.deployment.repository_dir
        self.ports = ports or Ports.of(self.deployment)
        self.host = host or self.deployment.server.host
        self.work_dir = work_dir or self.deployment.build_dir
        self.log_path = None if console_log else self.work_dir / "tritonserver.log"
        self.admin_key = secrets.token_urlsafe(24)
        # Where the stubs and the API front take turns on the GPUs (common/gpu_board.py); made by its first user.
        self.board_path = (gpu_board or board_path()) if self.deployment.takes_gpu_turns else None
        self.own_board = gpu_board is None
        self.process: subprocess.Popen | None = None
        self.watchdog: StubWatchdog | None = None
        self.stub_restarts: Counter = Counter()  # per model, over every tritonserver this object ran
        self.regions: set[str] = set()  # shared-memory regions of this tritonserver's stubs (the watchdog adds more)
        self.started = False  # this tritonserver came up (and the watchdog runs)
        self.left_a_dead_version = False  # the drain killed it: only a dead stub's version was left (shut_down)
        self._shutting_down = threading.Lock()  # held by the one shut_down() that runs

    @property
    def http_url(self) -> str:
        """tritonserver's own HTTP (behind the front when there is one)."""
        host, port = self.ports.triton_http_address(self.host)
        return f"{host}:{port}"

    @property
    def grpc_url(self) -> str:
        """tritonserver's own gRPC (behind the gRPC front when there is one)."""
        host, port = self.ports.triton_grpc_address(self.host)
        return f"{host}:{port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        if not any(self.repository.glob("*/config.pbtxt")):
            raise ServerError(f"{self.repository} is not a generated model repository: run `make repo` first")
        check_tensorrt_plans(self.repository)
        env = stub_environment()
        if self.board_path is not None:
            env[BOARD_ENVIRONMENT] = str(self.board_path)
        _, version = check_stub_python(env)
        prebuilt = prebuilt_triton()
        if prebuilt:
            binary, backends = prebuilt
        else:
            binary = triton_home() / "bin" / "tritonserver"
            backends = prepare_backends(self.work_dir, version)
        command = server_command(
            binary,
            self.repository,
            backends,
            self.ports,
            self.host,
            self.deployment.triton_exit_timeout_s,
            self.admin_key,
            self.deployment.uses_gpus,
            # With tenants the fronts check the keys, and Triton's ports are on loopback (serving/tenants.py).
            None if self.deployment.tenants.keys_file else api_key(),
            self.deployment.tracing,
            self.deployment.rate_limited,
        )
        return command, env

    def check_ports(self) -> None:
        """Refuse, naming the port and its setting, when something already listens on one of Triton's ports
        (a second `make serve`, say): otherwise tritonserver starts its stubs and only then fails."""
        http_host, http_port = self.ports.triton_http_address(self.host)
        metrics_host, metrics_port = self.ports.triton_metrics_address(self.host)
        metrics_setting = "--triton-metrics-port" if self.ports.triton_metrics else "server.metrics_port"
        checks = [
            (http_host, http_port, "front.triton_http_port" if self.ports.triton_http else "server.http_port"),
            (
                *self.ports.triton_grpc_address(self.host),
                "--triton-grpc-port" if self.ports.triton_grpc else "server.grpc_port",
            ),
            (metrics_host, metrics_port, metrics_setting),
        ]
        for host, port, setting in checks:
            require_free_port(host, port, setting)

    def start(self, timeout_s: float = 180.0) -> TritonServer:
        self.started = self.left_a_dead_version = False
        self._shutting_down = threading.Lock()
        command, env = self.command()
        self.check_ports()
        # A session of its own: a terminal's Ctrl-C reaches the launcher only (which drains), and every process
        # Triton starts (the stubs) is in its process group, so reap() can end what outlives it.
        spawn = {"env": env, "preexec_fn": die_with_parent, "start_new_session": True}
        if not self.deployment.uses_gpus:
            log.info(
                "CPU only (encoder.gpus is empty): Triton still logs one line"
                ' "CudaDriverHelper has not been initialized." here; it is harmless'
            )
        if self.log_path is None:
            self.process = subprocess.Popen(command, **spawn)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("wb") as log_file:  # the child keeps its own descriptor
                self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, **spawn)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"tritonserver exited with {self.process.returncode}; {self._log_tail()}")
            if self._http_ok("/v2/health/ready"):  # strict readiness: every model is ready
                self.regions = {stub.region for stub in stubs(self.process.pid)}
                interval = self.deployment.server.watchdog_interval_s
                if interval > 0:
                    self.watchdog = StubWatchdog(self.process.pid, self.http_url, self.admin_key, interval).start()
                self.started = True
                return self
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s; {self._log_tail()}")

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path is None:
            return "its log is above"
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"last lines of {self.log_path}:\n" + "\n".join(tail)

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def problems(self) -> list[str]:
        """What keeps this tritonserver from serving (none: it serves)."""
        if self.process is None or self.process.poll() is not None:
            return ["tritonserver is not running"]
        if not self.started:
            return ["tritonserver is starting"]
        if self._http_ok("/v2/health/ready"):
            problems = []
        else:  # a process being killed stops answering before it is gone: say which, once it is
            problems = [
                "tritonserver is not running" if self.process.poll() is not None else "tritonserver is not ready"
            ]
        return problems + (self.watchdog.problems() if self.watchdog else [])

    def stub_restarts_by_model(self) -> Counter:
        """Reloads of a model after one of its stubs died, over every tritonserver this object ran."""
        counts = Counter(self.stub_restarts)
        if self.watchdog:
            counts.update(restart.model for restart in self.watchdog.restarts)
        return counts

    def shut_down(self, quiet_s: float = 1.0, before_sigterm=None) -> None:
        """No more stub restarts; wait until no request is between two stages, none has completed and no stub
        has used CPU for quiet_s (at most server.exit_timeout_s); then SIGTERM Triton and wait for its exit.

        Why wait here: on SIGTERM Triton 2.51 finishes the model executions running, but refuses the next
        step of an ensemble request already in flight ("Server is stopping, scheduler for model has stopped
        accepting new inference requests") and then closes the streams of the rest. The stubs' CPU tells an
        execute() that runs longer than quiet_s (one stage: a whole request in one execute) from an idle one.
        `before_sigterm` runs once quiet: the API front stops there, since Triton 2.51 unloads a decoupled model only
        after the gRPC streams to it have closed (its streams stay open while it lives). Only the first call does it;
        a second one returns at once."""
        if not self._shutting_down.acquire(blocking=False):
            return
        if self.watchdog:
            self.watchdog.stop()
        bound = self.deployment.server.exit_timeout_s
        started = time.monotonic()
        ensembles = ensemble_steps(self.repository)
        last, quiet_since, quiet = None, started, False
        while time.monotonic() < started + bound and self.process and self.process.poll() is None:
            counts, cpu = self._stage_counts(), stubs_cpu_s(self.process.pid)
            if counts is None or last is None or counts != last[0] or cpu - last[1] > STUB_BUSY_CPU_S:
                last, quiet_since = (counts, cpu), time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s and not any(between_steps(s, counts) for s in ensembles):
                quiet = True
                break
            time.sleep(0.1)
        if self.process and self.process.poll() is None:
            waited = time.monotonic() - started
            why = "quiet" if quiet else f"the bound (server.exit_timeout_s = {bound})"
            exit_s = self.deployment.triton_exit_timeout_s
            log.info(f"drain: {why} after {waited:.1f} s; SIGTERM to tritonserver (exit timeout {exit_s} s)")
            if before_sigterm is not None:
                before_sigterm()
            self.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            # Triton has its exit timeout to finish; one that crashed in its own shutdown can hang in its signal
            # handler (seen: SIGSEGV and SIGABRT after "Exit timeout expired"), so it gets SIGKILL after that.
            try:
                code = self._wait_for_exit(exit_s + 10)
                took = time.monotonic() - signalled
                how = "killed: nothing but a dead stub's version left" if code is None else f"exit code {code}"
                log.info(f"tritonserver exited {took:.1f} s after SIGTERM ({how})")
            except subprocess.TimeoutExpired:
                log.warning("tritonserver did not exit after SIGTERM; killing it")
                self.process.kill()

    def _wait_for_exit(self, timeout_s: float, settled_s: float = 1.0) -> int | None:
        """tritonserver's exit code after SIGTERM; None when all it had left were model versions the watchdog
        replaced, and so it was killed (self.left_a_dead_version).

        Tritonserver 2.51 never unloads such a version once requests reached its dead stub: their response
        factories, which that stub alone would have released, hold it, and the version's other stubs live on
        (seen on the CPU and the H200, unary and streaming models alike: a stub killed idle stops with exit 0; one
        sent requests after its death, exit 1 at the exit timeout). Tritonserver finishes the requests in flight
        before it unloads any model, so once no stub but such a version's has been alive for settled_s, what it
        still waits for serves nothing."""
        if not (self.watchdog and self.watchdog.restarts):
            return self.process.wait(timeout=timeout_s)
        replaced = self.watchdog.replaced_stubs()
        deadline, settled_since = time.monotonic() + timeout_s, None
        while (code := self.process.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.process.args, timeout_s)
            if set(stubs(self.process.pid)) - replaced:
                settled_since = None
            elif settled_since is None:
                settled_since = time.monotonic()
            elif time.monotonic() - settled_since >= settled_s:
                log.info("drain: tritonserver waits only for model versions the watchdog replaced: SIGKILL")
                self.left_a_dead_version = True
                self.process.kill()
                self.process.wait()
                return None
            time.sleep(0.1)
        return code

    def _get_json(self, path: str) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return None

    def _stage_counts(self) -> dict[str, tuple[int, int]] | None:
        """(succeeded, failed) requests per model, from Triton's statistics API."""
        stats = self._get_json("/v2/models/stats")
        if stats is None:
            return None
        return {
            model["name"]: (model["inference_stats"]["success"]["count"], model["inference_stats"]["fail"]["count"])
            for model in stats["model_stats"]
        }

    def reap(self) -> None:
        """After tritonserver exited: end what it left running in its process group (stubs of a model version
        Triton never finished unloading, which outlive it and ignore SIGTERM), then remove the shared-memory
        regions of every stub it ran (16 MiB each; a killed stub's region outlives it)."""
        if self.process is None or self.process.poll() is None:
            return
        regions = set(self.regions)
        if self.watchdog:
            self.watchdog.stop()
            self.stub_restarts.update(restart.model for restart in self.watchdog.restarts)
            regions |= self.watchdog.regions
            self.watchdog = None
        deadline = time.monotonic() + 5
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
            while time.monotonic() < deadline:  # until the group is gone
                os.killpg(self.process.pid, 0)
                time.sleep(0.05)
        except (ProcessLookupError, PermissionError):
            pass  # nothing (left) in the group
        remove_regions(regions)
        self.regions = set()
        for path in engine_process_files(self.process.pid):
            path.unlink(missing_ok=True)  # a shared engine process's files (its group was just ended)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.shut_down()
            try:
                self.process.wait(
                    timeout=self.deployment.server.exit_timeout_s + self.deployment.triton_exit_timeout_s + 20
                )
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reap()
        if self.board_path is not None and self.own_board:
            self.board_path.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
