"""The images and the compose stack, checked statically (no Docker daemon here), and the pins of docker/versions.env.

hadolint on every Dockerfile, every pinned version against docker/versions.env wherever it is repeated
(Dockerfiles, compose, chart, docs), the build contexts, the compose file's structure, and the image's
Python 3.10 stand-ins (tomllib, numpy < 2). The image's health check runs against the real tritonserver in
tests/server/test_image_launcher.py."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
import yaml

from settings import ROOT, load_settings
from tests.support import (
    CHART,
    DOCKER,
    DOCKERFILES,
    VERSIONS,
    build_args,
    load_module,
)

healthcheck = load_module("healthcheck", DOCKER / "healthcheck.py")


# ---------------------------------------------------------------------------------------------------------
# Dockerfiles and build contexts
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    run = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILES[name])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_conventions(name):
    text = DOCKERFILES[name].read_text()
    lines = text.splitlines()
    # Every inline hadolint ignore says why, in the comment line above it.
    for index, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert lines[index - 1].startswith("#") and "hadolint" not in lines[index - 1], line
    assert re.search(r'^ENTRYPOINT \[".*"\]$', text, flags=re.M), "exec-form ENTRYPOINT"
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users and users[-1] not in ("0", "root", "0:0"), "runs as non-root"
    if name != "locust":  # the Locust image keeps its base image's user
        assert users[-1] == "${APP_UID}:${APP_UID}" and build_args(DOCKERFILES[name])["APP_UID"] != "0"
    assert "HEALTHCHECK" in text


def test_server_image_starts_the_launcher():
    text = DOCKERFILES["server"].read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, flags=re.M).group(1))
    command = json.loads(re.search(r"^CMD (.*)$", text, flags=re.M).group(1))
    assert entrypoint[1:] == ["python3", "-m", "serving.launcher"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--repository") + 1] == "/models"
    env = dict(re.findall(r"(\w+)=(\S+)", text[text.index("ENV PYTHONPATH") :].split("\n\n")[0]))
    assert env["TRITONSERVER_BIN"] == "/opt/bert-triton/docker/tritonserver.sh"
    assert env["TRITON_BACKENDS_DIR"] == "/opt/tritonserver/backends"
    assert env["HOME"] == "/tmp"
    health = re.search(r"CMD (\[.*healthcheck\.py.*\])", text).group(1)
    assert json.loads(health) == ["python3", "/opt/bert-triton/docker/healthcheck.py"]
    assert 'if [ "${WITH_TORCH}" = "1" ]' in text and "torch==${TORCH_VERSION}" in text
    assert build_args(DOCKERFILES["server"])["WITH_TORCH"] == "0"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_build_context_holds_what_the_dockerfile_copies(name):
    dockerfile = DOCKERFILES[name]
    patterns = [
        line
        for line in Path(f"{dockerfile}.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "an allow-list: the context root holds .venv and build/"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY"):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert bool(sources) == (name != "locust")
    for source in sources:
        source = source.rstrip("/")
        assert (ROOT / source).exists(), source
        assert any(source == a or source.startswith(a + "/") for a in allowed), f"{source} is ignored"


# ---------------------------------------------------------------------------------------------------------
# Versions: docker/versions.env is the one source
# ---------------------------------------------------------------------------------------------------------
def test_versions_agree_with_versions_env():
    ngc = VERSIONS["NGC_RELEASE"]
    assert VERSIONS["TRITONSERVER_IMAGE"] == f"nvcr.io/nvidia/tritonserver:{ngc}-py3"
    assert VERSIONS["TENSORRT_IMAGE"] == f"nvcr.io/nvidia/tensorrt:{ngc}-py3"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert VERSIONS["IMAGE_TAG"] == f"{project['version']}-ngc{ngc}"

    # Build-arg defaults of both Dockerfiles.
    for dockerfile in DOCKERFILES.values():
        for name, default in build_args(dockerfile).items():
            if name in VERSIONS:
                assert default == VERSIONS[name], f"{dockerfile.name}: ARG {name}={default}"
    assert build_args(DOCKERFILES["server"])["TRITONSERVER_IMAGE"] == VERSIONS["TRITONSERVER_IMAGE"]
    assert build_args(DOCKERFILES["builder"])["TENSORRT_IMAGE"] == VERSIONS["TENSORRT_IMAGE"]

    # Python packages of the server image: pyproject's pins, except where no Python 3.10 wheel exists.
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    pins = dict(re.fullmatch(r"([\w-]+)(?:\[[\w,]+\])?==(\S+)", line).groups() for line in requirements)
    no_cp310_wheel = {"onnxruntime"}  # 1.32.0 needs Python >= 3.11 (the comment in versions.env says so)
    packages = ("numpy", "tokenizers", "onnxruntime", "tritonclient", "torch", "safetensors", "aiohttp", "orjson")
    for package in (*packages, "nvidia-ml-py"):
        pinned = VERSIONS[f"{package.upper().replace('-', '_')}_VERSION"]
        if package in no_cp310_wheel:
            assert (
                pinned != pins[package]
                and f"{package} {pins[package]} needs Python >= 3.11" in (DOCKER / "versions.env").read_text()
            )
        else:
            assert pinned == pins[package], package
    assert VERSIONS["LOCUST_IMAGE"].endswith(f":{pins['locust']}")
    assert VERSIONS["AIOHTTP_VERSION"] == pins["aiohttp"]
    otel = VERSIONS["OPENTELEMETRY_VERSION"]
    assert otel == pins["opentelemetry-sdk"] == pins["opentelemetry-exporter-otlp-proto-http"]

    # The chart.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSIONS["IMAGE_TAG"]
    assert chart["annotations"]["bert-triton/tritonserver-image"] == VERSIONS["TRITONSERVER_IMAGE"]
    assert chart["annotations"]["bert-triton/tensorrt-image"] == VERSIONS["TENSORRT_IMAGE"]
    assert chart["annotations"]["bert-triton/tensorrt-version"] == VERSIONS["TENSORRT_VERSION"]


def test_compose_defaults_agree_with_versions_env():
    text = (DOCKER / "compose.yaml").read_text()
    defaults = dict(re.findall(r"\$\{(\w+):-([^}]*)\}", text))
    for name, default in defaults.items():
        if name in VERSIONS:
            assert default == VERSIONS[name], f"compose.yaml: {name} defaults to {default}"
    assert defaults["SERVER_IMAGE"] == f"bert-triton-server:{VERSIONS['IMAGE_TAG']}"
    assert defaults["LOCUST_LOCAL_IMAGE"] == f"bert-triton-locust:{VERSIONS['IMAGE_TAG']}"
    compose = yaml.safe_load(text)
    # Every build arg is one the Dockerfile declares, and every pin it declares is passed.
    for service, dockerfile in (("triton", "server"), ("locust", "locust")):
        build = compose["services"][service]["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKERFILES[dockerfile]
        declared = build_args(DOCKERFILES[dockerfile])
        assert set(build["args"]) <= set(declared)
        assert {name for name in declared if name in VERSIONS} <= set(build["args"])


DOC_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    DOCKER / "README.md",
    ROOT / "helm" / "README.md",
    CHART / "README.md",
    CHART / "values.yaml",
    CHART / "templates" / "NOTES.txt",
    *DOCKERFILES.values(),
    DOCKER / "compose.yaml",
    *sorted((ROOT / "helm" / "values").glob("*.yaml")),
]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_the_pinned_versions(path):
    text = path.read_text()
    for image, tag in re.findall(r"nvcr\.io/nvidia/(tritonserver|tensorrt):([\w.-]+)", text):
        assert tag == f"{VERSIONS['NGC_RELEASE']}-py3", f"{image}:{tag}"
    for tag in re.findall(r"bert-triton-(?:server|engine-builder):([\w.$-]+)", text):
        assert tag.removesuffix("-torch") in (VERSIONS["IMAGE_TAG"], "$IMAGE_TAG", "$(IMAGE_TAG)"), tag
    for release in re.findall(r"(?:tritonserver|TensorRT|NGC) (\d\d\.\d\d)\b", text):
        assert release == VERSIONS["NGC_RELEASE"], release
    for version in re.findall(r"TensorRT ((?:1\d|[1-9])\.\d+(?:\.\d+)?)\b", text):  # not an NGC release
        assert VERSIONS["TENSORRT_VERSION"].startswith(version), version
    for version in re.findall(r"Triton (2\.\d+(?:\.\d+)?)\b", text):
        assert version in ("2.51", "2.51.0"), version


# ---------------------------------------------------------------------------------------------------------
# The compose stack
# ---------------------------------------------------------------------------------------------------------
def test_compose_stack():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"triton", "prometheus", "grafana", "locust"}
    triton = services["triton"]
    assert triton["build"]["context"] == ".." and triton["build"]["dockerfile"] == "docker/server.Dockerfile"
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert triton["read_only"] is True and triton["tmpfs"] == ["/tmp"] and triton["shm_size"]
    assert "healthcheck" not in triton  # the image's HEALTHCHECK: one real inference
    command = triton["command"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    mounts = dict(reversed(volume.removesuffix(":ro").rsplit(":", 1)) for volume in triton["volumes"])
    settings_source = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", mounts["/etc/bert-triton/settings.toml"])
    assert (DOCKER / settings_source).resolve() == ROOT / "settings" / "defaults.toml"
    assert command[command.index("--settings") + 1] in mounts and command[command.index("--repository") + 1] in mounts

    server = load_settings().server
    published = [int(port.rsplit(":", 1)[1]) for port in triton["ports"]]
    assert published == [server.http_port, server.grpc_port, server.metrics_port]
    assert all(port.startswith("127.0.0.1:") for s in services.values() for port in s.get("ports", []))

    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"triton:{server.metrics_port}"]

    grafana = services["grafana"]
    for volume in grafana["volumes"] + services["prometheus"]["volumes"]:
        assert (DOCKER / volume.split(":")[0]).exists(), volume
    assert "../helm/bert-triton/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/bert-triton.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"

    locust = services["locust"]
    command = locust["command"]
    assert command[command.index("-f") + 1] == "/mnt/project/loadtest/locustfile.py"  # by path
    assert "..:/mnt/project:ro" in locust["volumes"] and locust["environment"]["PYTHONPATH"] == "/mnt/project"
    assert locust["depends_on"]["triton"]["condition"] == "service_healthy"
    assert command[command.index("--host") + 1] == f"${{LOCUST_HOST:-http://triton:{server.http_port}}}"
    assert command[command.index("--settings") + 1] == "/mnt/project/${SETTINGS:-settings/defaults.toml}"
    locustfile = ROOT / "loadtest" / "locustfile.py"
    if locustfile.exists():  # written alongside; the user class and the option the command names
        user = re.fullmatch(r"\$\{LOCUST_USER:-(\w+)\}", command[-1]).group(1)
        assert f"class {user}(" in locustfile.read_text() and '"--settings"' in locustfile.read_text()


def test_tomllib_stand_in_reads_the_settings():
    """docker/compat/tomllib.py is tomli, the image's version of it (a parser of its own, not the standard
    library's), and reads the settings as tomllib does."""
    import tomli

    compat = load_module("compat_tomllib", DOCKER / "compat" / "tomllib.py")
    assert compat.loads is tomli.loads and compat.TOMLDecodeError is tomli.TOMLDecodeError
    assert importlib.metadata.version("tomli") == VERSIONS["TOMLI_VERSION"]
    text = (ROOT / "settings" / "defaults.toml").read_text()
    assert compat.loads(text) == tomllib.loads(text)
    with pytest.raises(compat.TOMLDecodeError):
        compat.loads("[model\n")


def test_numpy_below_2_here_as_in_the_image():
    assert int(np.__version__.split(".")[0]) < 2 and VERSIONS["NUMPY_VERSION"] == np.__version__
