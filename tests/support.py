"""Helpers the tests share: the docker folder, loading a script as a module, reading Prometheus text."""

from __future__ import annotations

import importlib.util
import re
import urllib.request
from pathlib import Path

from export.tensorrt import read_versions
from serving.launcher.gpu_metrics import FAMILIES
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
