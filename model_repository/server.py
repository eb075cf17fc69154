"""python -m model_repository.server: run NVIDIA's real tritonserver (from the nvidia-pytriton wheel).

The Python backend's stub embeds the `python3` found first on PATH, so the launcher puts this
interpreter's folder first and refuses to start when that interpreter has numpy >= 2: Triton 2.51's stub
then silently reads every numeric input element as element 0 and crashes on strings.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from model_repository.settings import Settings, SettingsError, load_settings

# Python backend shared-memory pool per model instance: large enough for a full dynamic batch of
# token ids and embeddings without growing it request by request.
SHM_DEFAULT_BYTES = 16 * 1024 * 1024


class ServerError(RuntimeError):
    """tritonserver cannot be started as asked."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(f"{name} is not installed: pip install nvidia-pytriton==0.7.0 (run `make setup`)")
    return Path(next(iter(spec.submodule_search_locations)))


def triton_home() -> Path:
    """Folder with bin/tritonserver, backends/ and python_backend_stubs/ from the nvidia-pytriton wheel."""
    return _package_dir("pytriton") / "tritonserver"


def triton_libs() -> Path:
    return _package_dir("pytriton").parent / "nvidia_pytriton.libs"


def prebuilt_triton() -> tuple[Path, Path] | None:
    """(tritonserver, backends dir) named by TRITONSERVER_BIN and TRITON_BACKENDS_DIR, if both are set.

    For a tritonserver that does not come from the wheel (an unpacked copy on a GPU machine, say): its
    backends folder must already hold the Python backend with the right stub, and LD_LIBRARY_PATH its libs.
    """
    binary, backends = os.environ.get("TRITONSERVER_BIN"), os.environ.get("TRITON_BACKENDS_DIR")
    return (Path(binary), Path(backends)) if binary and backends else None


def stub_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if prebuilt_triton() is None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(triton_libs()), env.get("LD_LIBRARY_PATH")]))
    return env


def numpy_problem(version: str) -> str | None:
    """Why a numpy version cannot run in the 2.51 stub, or None when it can."""
    if not version:
        return "numpy is not importable there"
    if int(version.split(".")[0]) >= 2:
        return (
            f"numpy {version} is installed there; Triton 2.51's Python backend stub needs numpy < 2 "
            "(with numpy 2 it silently corrupts numeric inputs). Install numpy<2 in that environment: "
            "pip install 'numpy<2'"
        )
    return None


def check_stub_python(env: dict[str, str]) -> tuple[str, str]:
    """(python3 path, X.Y) of the interpreter the stub will embed; raises ServerError if it is unusable."""
    python = shutil.which("python3", path=env["PATH"])
    if python is None:
        raise ServerError("no python3 on PATH for Triton's Python backend stub")
    probe = subprocess.run(
        [
            python,
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2]);\n"
            "try:\n import numpy; print(numpy.__version__)\nexcept ImportError:\n print('')",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    lines = [*probe.stdout.splitlines(), ""]
    problem = numpy_problem(lines[1].strip())
    if problem:
        raise ServerError(f"refusing to start: the Python backend stub would run {python}, and {problem}")
    return python, lines[0].strip()


def prepare_backends(build_dir: Path, python_version: str) -> Path:
    """backends/python with the stub built for the interpreter the stub will embed."""
    home = triton_home()
    stub = home / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton ships no Python backend stub for Python {python_version}")
    backends = build_dir / "triton_backends"
    python_backend = backends / "python"
    if python_backend.exists():
        shutil.rmtree(python_backend)
    shutil.copytree(home / "backends" / "python", python_backend, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, python_backend / "triton_python_backend_stub")
    return backends


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls) -> Ports:
        """Three ports nothing listens on now (for tests and benchmarks beside a running server)."""
        sockets = [socket.socket() for _ in range(3)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        ports = [sock.getsockname()[1] for sock in sockets]
        for sock in sockets:
            sock.close()
        return cls(*ports)


def server_command(binary: Path, repository: Path, backends: Path, ports: Ports, host: str) -> list[str]:
    return [
        str(binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--http-address={host}",
        f"--http-port={ports.http}",
        f"--grpc-address={host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={host}",
        f"--metrics-port={ports.metrics}",
        f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
        "--strict-readiness=true",
        "--exit-timeout-secs=10",
        "--log-verbose=0",
    ]


def check_tensorrt_plans(repository: Path, gpu_identity=None, tensorrt_version: str | None = None) -> None:
    """Refuse a repository whose TensorRT plans were built for another GPU or TensorRT version.

    Triton would otherwise fail deep inside plan deserialization, or serve a plan tuned for another chip.
    The server's TensorRT version comes from TRT_VERSION, which NGC images set.
    """
    import json

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from export.tensorrt_build import gpu_identity as query_gpu
    from export.tensorrt_build import plan_problems

    for config_path in sorted(repository.glob("*/config.pbtxt")):
        config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
        if config.platform != "tensorrt_plan":
            continue
        sidecar_path = config_path.parent / "1" / (config.default_model_filename + ".json")
        if not sidecar_path.is_file():
            raise ServerError(f"{sidecar_path} is missing: a plan without its build record is not served")
        sidecar = json.loads(sidecar_path.read_text())
        version = tensorrt_version or os.environ.get("TRT_VERSION")
        if not version:
            raise ServerError("cannot tell this server's TensorRT version: set TRT_VERSION (NGC images set it)")
        gpus = sorted({gpu for group in config.instance_group for gpu in group.gpus}) or [0]
        for gpu in gpus:
            problems = plan_problems(sidecar, (gpu_identity or query_gpu)(gpu), version)
            if problems:
                raise ServerError(
                    f"refusing {config.name}'s plan on GPU {gpu}: " + "; ".join(problems) + ". Run `make engines` "
                    "on this machine type (the plan is cached per GPU product) and regenerate the repository."
                )


class TritonServer:
    """A tritonserver child process; `with TritonServer(...) as server:` waits until the ensemble is ready."""

    def __init__(
        self,
        settings: Settings,
        repository: Path | None = None,
        ports: Ports | None = None,
        host: str | None = None,
        work_dir: Path | None = None,
    ) -> None:
        """work_dir (default: the settings' build dir) holds the prepared backends folder and the log, so
        several servers can run side by side from one settings object."""
        self.settings = settings
        self.repository = repository or settings.repository_dir
        self.ports = ports or Ports(settings.server.http_port, settings.server.grpc_port, settings.server.metrics_port)
        self.host = host or settings.server.host
        self.work_dir = work_dir or settings.build_dir
        self.log_path = self.work_dir / "tritonserver.log"
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        if not (self.repository / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"{self.repository} is not a generated model repository: run `make repo` first")
        check_tensorrt_plans(self.repository)
        env = stub_environment()
        _, version = check_stub_python(env)
        prebuilt = prebuilt_triton()
        if prebuilt:
            binary, backends = prebuilt
        else:
            binary = triton_home() / "bin" / "tritonserver"
            backends = prepare_backends(self.work_dir, version)
        return server_command(binary, self.repository, backends, self.ports, self.host), env

    def start(self, timeout_s: float = 180.0) -> TritonServer:
        command, env = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"tritonserver exited with {self.process.returncode}; {self._log_tail()}")
            if self.model_ready("ensemble"):
                return self
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s; {self._log_tail()}")

    def _log_tail(self, lines: int = 40) -> str:
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"last lines of {self.log_path}:\n" + "\n".join(tail)

    def model_ready(self, model: str) -> bool:
        url = f"http://{self.http_url}/v2/models/{model}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_repository.server", description=__doc__)
    parser.add_argument("--settings", help="settings file (default: model_repository/settings.toml)")
    parser.add_argument("--repository", type=Path, help="model repository (default: from the settings)")
    parser.add_argument("--host", help="bind address (default: server.host from the settings)")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.settings)
        server = TritonServer(settings, args.repository, host=args.host)
        command, env = server.command()
    except (SettingsError, ServerError) as exc:
        print(f"serve failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"tritonserver: HTTP {server.http_url}, gRPC {server.grpc_url}, metrics {server.host}:{server.ports.metrics}",
        flush=True,
    )
    os.execve(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
