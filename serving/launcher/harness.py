"""How tests, benchmarks and `make reliability` run a server of their own on free ports: `Launcher`, the real
launcher as a child process (fronts, supervision, health port), and `local_server`, a TritonServer in the
calling process (tritonserver and its watchdog only). Nothing of the launcher imports this module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from serving.launcher.procfs import child_processes, stub_processes
from serving.launcher.triton_command import Ports
from serving.launcher.tritonserver import TritonServer
from settings import Deployment, Settings, override_flags


def local_server(settings: Settings | Deployment, repository: Path, work_dir: Path) -> TritonServer:
    """A TritonServer on free ports of 127.0.0.1, not yet started (`with local_server(...) as server:`); its
    backends folder and log in work_dir, apart from `make serve`'s."""
    return TritonServer(settings, repository, Ports.free(), "127.0.0.1", work_dir=work_dir)


def launcher_ready(health_port: int, timeout_s: float = 2.0) -> tuple[int, dict]:
    """(HTTP status, body) of the launcher's /ready on 127.0.0.1:health_port; (0, {}) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/ready", timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}


class Launcher:
    """The real launcher (`python -m serving.launcher`) as a child process on given ports, its output in log_path."""

    def __init__(
        self,
        settings_path: Path | list[Path],
        repository: Path,
        ports: Ports,
        log_path: Path,
        overrides: list[str] | tuple[str, ...] = (),
    ) -> None:
        """settings_path: one settings file, or one per model of a several-model server; overrides: its --set."""
        self.settings_path, self.repository, self.ports, self.log_path = settings_path, repository, ports, log_path
        self.overrides = overrides
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> Launcher:
        paths = self.settings_path if isinstance(self.settings_path, list) else [self.settings_path]
        command = [sys.executable, "-m", "serving.launcher", "--settings", *map(str, paths)]
        command += ["--repository", str(self.repository), "--host", "127.0.0.1"]
        command += override_flags(self.overrides)
        for name in ("http", "grpc", "metrics", "health", "triton_http", "api", "triton_grpc"):
            if name != "triton_grpc" or self.ports.triton_grpc:
                command += [f"--{name.replace('_', '-')}-port", str(getattr(self.ports, name))]
        with self.log_path.open("ab") as log:
            # A process group of its own, as a terminal's job gets: interrupt() is what Ctrl-C there sends.
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while self.ready()[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the launcher did not come up; see {self.log_path}")
            time.sleep(0.1)
        return self

    def ready(self) -> tuple[int, dict]:
        return launcher_ready(self.ports.health)

    @property
    def triton_pid(self) -> int:
        (pid,) = [pid for pid, _, argv in child_processes(self.process.pid) if argv[0].endswith(b"tritonserver")]
        return pid

    def stub_pids(self, model: str) -> list[int]:
        return stub_processes(self.triton_pid).get(model, [])

    def expected_stubs(self, model: str) -> int:
        """Stubs `model` runs: its instance groups' counts (per GPU listed), from Triton's model config."""
        url = f"http://127.0.0.1:{self.ports.http}/v2/models/{model}/config"
        with urllib.request.urlopen(url, timeout=5) as response:
            groups = json.loads(response.read()).get("instance_group", [])
        return sum(group.get("count", 1) * max(1, len(group.get("gpus", []))) for group in groups)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def interrupt(self) -> None:
        """SIGINT to the launcher's whole process group, as Ctrl-C in its terminal does."""
        os.killpg(self.process.pid, signal.SIGINT)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.health}/metrics", timeout=5) as response:
            return response.read().decode()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
