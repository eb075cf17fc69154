"""What the chart tests share: the chart, its values files and overlays, and rendering it offline (helm_python,
Helm 4's SDK, no helm binary)."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes_validate.utils import latest_version

from settings import ROOT, load_settings

CHART = ROOT / "helm" / "bert-triton"
VALUES_DIR = ROOT / "helm" / "values"
OVERLAYS = {path.stem: path for path in sorted(VALUES_DIR.glob("*.yaml"))}
CONFIGS = ["default", *OVERLAYS]
KUBE_VERSIONS = ("1.29.0", latest_version())
SETTINGS_FILES = [
    ROOT / "settings" / "defaults.toml",
    *sorted((ROOT / "settings" / "variants").glob("*.toml")),
]
GPU_ENGINES = ("torch", "tensorrt")
GPU = "nvidia.com/gpu"
SERVER_IMAGE_HEALTHCHECK = "/opt/bert-triton/docker/healthcheck.py"


def overlay(config: str) -> dict:
    return {} if config == "default" else yaml.safe_load(OVERLAYS[config].read_text())


def render(chart, values: dict | None = None) -> dict[str, list[dict]]:
    """kind -> rendered objects (NOTES.txt under "NOTES")."""
    out = chart.render(values or {}, name="bert", namespace="ml", is_install=True)
    objects: dict[str, list] = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            objects["NOTES"] = [text]
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.setdefault(doc["kind"], []).append(doc)
    return objects


def with_settings(path: Path, **values) -> dict:
    """Values embedding a settings file as helm/sync_settings.py does: read over the defaults, complete."""
    return {"settings": {"source": str(path.relative_to(ROOT)), "toml": load_settings(path).as_toml()}, **values}


def server_container(objects) -> dict:
    (deployment,) = objects["Deployment"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton"]
    return container


def pod_spec(objects) -> dict:
    (deployment,) = objects["Deployment"]
    return deployment["spec"]["template"]["spec"]
