"""Helpers the suites share: the docker folder, loading a script as a module, reading Prometheus text, GPU
readings and identities to feed the code that reads GPUs, TensorRT's presence, client URLs, calls to a launcher's
API front, over-limit texts."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from export.tensorrt import read_versions
from serving.launcher.gpu_metrics import FAMILIES, GpuReading, NvmlGpus
from settings import ROOT

DOCKER = ROOT / "docker"
CHART = ROOT / "helm" / "bert-triton"
DOCKERFILES = {name: DOCKER / f"{name}.Dockerfile" for name in ("server", "builder", "locust")}
VERSIONS = read_versions()
# The metrics port carries these only where NVML sees a GPU (none here): serving/launcher/gpu_metrics.py.
GPU_METRICS = {name for name, *_ in FAMILIES}


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_args(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", dockerfile.read_text(), flags=re.M))


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def samples(text: str, name: str, **labels) -> float:
    """Sum of the samples of metric `name` whose labels include `labels`."""
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:{{(.*?)}})? (\S+)$", text, flags=re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if labels.items() <= found.items():
            total += float(match.group(2))
    return total


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"^([a-zA-Z_:][\w:]*)(?:{| )", text, flags=re.M))


# The GPU readings the metrics tests feed the formatter and the metrics port (no GPU here), and this machine's NVML.
NVML = NvmlGpus()
H200_READING = GpuReading(
    uuid="GPU-6e1c3c2f-0b7e-4a55-9f2e-1d2c3b4a5f60",
    utilization=0.87,
    memory_used_bytes=12_884_901_888,
    memory_total_bytes=150_754_820_096,
    power_watts=412.5,
    power_limit_watts=700.0,
    energy_joules=5321.25,
    sm_clock_hz=1_980_000_000.0,
)
SECOND_READING = GpuReading(uuid="GPU-00000000-0000-0000-0000-000000000002", utilization=0.0, memory_used_bytes=0)


class Readings:
    """A stand-in for NvmlGpus that reports the readings it was given."""

    problem = None

    def __init__(self, *readings: GpuReading) -> None:
        self.readings = list(readings)

    available = property(lambda self: bool(self.readings))

    def __len__(self) -> int:
        return len(self.readings)

    def read(self) -> list[GpuReading]:
        return self.readings


def families(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (TYPE, sample lines); fails on a family declared twice or a sample before its TYPE."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in found, f"family {name} declared twice"
            found[name], current = (kind, []), name
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][\w:]*", line).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert current in (name, base), f"sample {name} outside its family ({current})"
            found[current][1].append(line)
    return found


# A GPU as TensorRT's plan checks identify one.
H200_IDENTITY = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
HAVE_TENSORRT = importlib.util.find_spec("tensorrt") is not None

HAVE_GPU = (
    shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
)

needs_tensorrt = pytest.mark.skipif(
    not (HAVE_TENSORRT and HAVE_GPU), reason="needs TensorRT's Python bindings and an NVIDIA GPU (NGC TensorRT image)"
)
PROTOCOLS = ("grpc", "http")


def api_url(launcher) -> str:
    """The base URL of a launcher's OpenAI- and TEI-compatible API front."""
    return f"http://127.0.0.1:{launcher.ports.api}"


def api_post(launcher, path: str, body: dict, timeout: float = 60) -> tuple[int, object]:
    """(status, JSON answer) of a POST to the launcher's API front; an error status is returned, not raised."""
    request = urllib.request.Request(
        api_url(launcher) + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def api_get(launcher, path: str) -> object:
    with urllib.request.urlopen(api_url(launcher) + path, timeout=10) as response:
        return json.loads(response.read())


def url(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def over_limit_texts(limit: int) -> dict[str, bytes]:
    return {
        "one-byte-over": b"x" * (limit + 1),
        # Fewer characters than the limit, more bytes: the limit is on bytes.
        "multi-byte": ("東" * (limit // 3 + 1)).encode(),
        # 4 MB without spaces: seconds of tokenizing (no prefix to cut), were it not refused unread.
        "four-times": ("東京" * (4 * limit // 6)).encode(),
    }


def make_cross_encoder(path: Path, seed: int = 0, **config) -> Path:
    """A BERT cross-encoder of random weights (2 layers, hidden 128, one label) with a real vocabulary (MiniLM's
    WordPiece), saved as Hugging Face saves one (tests/checkpoints.py make_checkpoint): what a reranker test serves
    and holds to sentence-transformers' CrossEncoder. Its scores spread over about +-3."""
    from tests.checkpoints import make_checkpoint

    shape = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512}
    return make_checkpoint(path, "bert", "rerank", seed=seed, **{**shape, **config})
