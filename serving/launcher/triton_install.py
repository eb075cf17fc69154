"""Where tritonserver and its Python backend come from, and what must hold before it starts.

The nvidia-pytriton wheel ships tritonserver 2.51, its libraries and a Python backend stub per Python version;
an NGC image names its own through TRITONSERVER_BIN and TRITON_BACKENDS_DIR. The stub embeds the `python3`
found first on PATH, so that interpreter's numpy is checked (numpy >= 2 corrupts inputs in the 2.51 stub),
and a repository's TensorRT plans must have been built for this GPU and TensorRT version.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from serving.processes import ServerError


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


def check_tensorrt_plans(repository: Path, gpu_identity=None, tensorrt_version: str | None = None) -> None:
    """Refuse a repository whose TensorRT plans were built for another GPU or TensorRT version.

    Triton would otherwise fail deep inside plan deserialization, or serve a plan tuned for another chip.
    The server's TensorRT version comes from TRT_VERSION, which NGC images set.
    """
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
