"""The images and the compose stack, checked statically, and the pins of docker/versions.env.

hadolint on every Dockerfile, every pinned version against docker/versions.env wherever it is repeated
(Dockerfiles, compose, chart, docs, the local base's build), the build contexts, the compose file's structure, the
image's Python 3.10 stand-ins (tomllib, numpy < 2) and the health check's API part against a stand-in front. The
image's health check runs against the real tritonserver in tests/server/test_image_launcher.py; the images themselves
are built and run by make image and make image-test (tests/image/served_image.py)."""

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

from settings import ROOT, load_deployment, load_settings
from tests.support import (
    CHART,
    DOCKER,
    DOCKERFILES,
    VERSIONS,
    build_args,
    load_module,
)

# Every Dockerfile here: the three images, and the local base they are built on by make image.
ALL_DOCKERFILES = {path.name.removesuffix(".Dockerfile"): path for path in sorted(DOCKER.glob("*.Dockerfile"))}


# ---------------------------------------------------------------------------------------------------------
# Dockerfiles and build contexts
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_hadolint_passes(name):
    assert set(DOCKERFILES) < set(ALL_DOCKERFILES)
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    run = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(ALL_DOCKERFILES[name])],
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


@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_dockerfiles_build_offline_with_buildkits_own_frontend(name):
    """No `# syntax=` line (BuildKit would pull docker/dockerfile from Docker Hub); every pip install reads the
    pip_cert secret where one is given; an ARG a step after FROM names is declared after FROM."""
    text = ALL_DOCKERFILES[name].read_text()
    assert not re.search(r"^# *syntax *=", text, flags=re.M | re.I)
    for step in re.split(r"\n(?=[A-Z]+ )", text):
        if step.startswith("RUN") and re.search(r"pip (install|download)", step):
            assert step.startswith("RUN --mount=type=secret,id=pip_cert") and "PIP_CERT=/run/secrets/pip_cert" in step
    base = re.search(r"^FROM \$\{(\w+)\}$", text, flags=re.M)
    name, after = base.group(1), text[base.end() :]
    if f"${{{name}}}" in after:
        assert re.search(rf"^ARG {name}$", after, flags=re.M), f"{name} again after FROM"


def test_server_image_starts_the_launcher():
    text = DOCKERFILES["server"].read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, flags=re.M).group(1))
    command = json.loads(re.search(r"^CMD (.*)$", text, flags=re.M).group(1))
    assert entrypoint == ["/opt/bert-triton/docker/entrypoint.sh", "python3", "-m", "serving.launcher"]
    assert "/opt/nvidia/nvidia_entrypoint.sh" in (DOCKER / "entrypoint.sh").read_text()
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--repository") + 1] == "/models"
    env = dict(re.findall(r"(\w+)=(\S+)", text[text.index("ENV PYTHONPATH") :].split("\n\n")[0]))
    assert env["TRITONSERVER_BIN"] == "/opt/bert-triton/docker/tritonserver.sh"
    assert env["TRITON_BACKENDS_DIR"] == "/opt/tritonserver/backends"
    assert env["HOME"] == "/tmp"
    health = re.search(r"CMD (\[.*healthcheck\.py.*\])", text).group(1)
    api = f"http://127.0.0.1:{load_settings().api.port}"
    assert json.loads(health) == ["python3", "/opt/bert-triton/docker/healthcheck.py", "--api-url", api]
    assert str(load_settings().api.port) in re.search(r"^EXPOSE (.*)$", text, flags=re.M).group(1).split()
    assert 'if [ "${WITH_TORCH}" = "1" ]' in text and "torch==${TORCH_VERSION}" in text
    assert build_args(DOCKERFILES["server"])["WITH_TORCH"] == "0"


@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_build_context_holds_what_the_dockerfile_copies(name):
    dockerfile = ALL_DOCKERFILES[name]
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
    assert bool(sources) == (name not in ("locust", "base"))
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

    # Build-arg defaults of every Dockerfile.
    for dockerfile in ALL_DOCKERFILES.values():
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
    for package in (*packages, "grpcio", "nvidia-ml-py"):
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

    # The local base (make image): the wheel `make serve` runs, and pyproject's onnxruntime on its Python 3.11.
    assert VERSIONS["PYTRITON_VERSION"] == pins["nvidia-pytriton"]
    assert VERSIONS["LOCAL_ONNXRUNTIME_VERSION"] == pins["onnxruntime"]
    assert VERSIONS["LOCUST_VERSION"] == pins["locust"]
    release = VERSIONS["DEBIAN_RELEASE"]
    assert VERSIONS["LOCAL_IMAGE_TAG"] == f"{project['version']}-{release}"
    assert VERSIONS["LOCAL_PYTHON_IMAGE"] == f"bert-triton-python:{release}"
    assert VERSIONS["LOCAL_BASE_IMAGE"] == f"bert-triton-base:{VERSIONS['TRITON_VERSION']}-{release}"
    assert build_args(ALL_DOCKERFILES["base"])["PYTHON_IMAGE"] == VERSIONS["LOCAL_PYTHON_IMAGE"]

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
    *ALL_DOCKERFILES.values(),
    DOCKER / "compose.yaml",
    DOCKER / "compose.gpu.yaml",
    ROOT / "docs" / "results" / "cpu-2026-12-05" / "images" / "README.md",
    *sorted((ROOT / "helm" / "values").glob("*.yaml")),
]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_the_pinned_versions(path):
    text = path.read_text()
    for image, tag in re.findall(r"nvcr\.io/nvidia/(tritonserver|tensorrt):([\w.-]+)", text):
        assert tag == f"{VERSIONS['NGC_RELEASE']}-py3", f"{image}:{tag}"
    tags = [VERSIONS[name] for name in ("IMAGE_TAG", "LOCAL_IMAGE_TAG")]
    tags += ["$IMAGE_TAG", "$(IMAGE_TAG)", "$LOCAL_IMAGE_TAG", "$(LOCAL_IMAGE_TAG)"]
    for tag in re.findall(r"bert-triton-(?:server|engine-builder|locust):([\w.$()-]+)", text):
        assert tag.removesuffix("-torch") in tags, tag
    for image in re.findall(r"bert-triton-(?:base|python):[\w.$()-]+", text):
        assert image in (VERSIONS["LOCAL_BASE_IMAGE"], VERSIONS["LOCAL_PYTHON_IMAGE"]), image
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
    """Every service on the host's network, listening on 127.0.0.1 only; the GPUs in compose.gpu.yaml and Prometheus
    and Grafana in the profile "observability", so that compose.yaml alone serves on a CPU from images built here."""
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"triton", "prometheus", "grafana", "locust"}
    assert all(service["network_mode"] == "host" and "ports" not in service for service in services.values())
    assert [name for name, service in services.items() if "profiles" not in service] == ["triton", "locust"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["observability"]
    triton = services["triton"]
    assert triton["build"]["context"] == ".." and triton["build"]["dockerfile"] == "docker/server.Dockerfile"
    assert "deploy" not in triton
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]
    (device,) = gpu["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert set(gpu) == {"triton"} and device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert triton["read_only"] is True and triton["tmpfs"] == ["/tmp"] and triton["shm_size"]
    assert "healthcheck" not in triton  # the image's HEALTHCHECK: one real inference
    command = triton["command"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    mounts = dict(reversed(volume.removesuffix(":ro").rsplit(":", 1)) for volume in triton["volumes"])
    settings_source = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", mounts["/etc/bert-triton/settings.toml"])
    assert (DOCKER / settings_source).resolve() == ROOT / "settings" / "defaults.toml"
    assert command[command.index("--settings") + 1] in mounts and command[command.index("--repository") + 1] in mounts
    # Docker's default 10 s would SIGKILL a drain: the chart's grace period for the defaults, at least.
    deployment = load_deployment()
    grace_s = deployment.first.server.exit_timeout_s + deployment.triton_exit_timeout_s + 10
    stop = re.fullmatch(r"\$\{STOP_GRACE_PERIOD:-(\d+)s\}", triton["stop_grace_period"])
    assert int(stop.group(1)) >= grace_s

    server = load_settings().server
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{server.metrics_port}"]
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]

    grafana = services["grafana"]
    assert grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    for volume in grafana["volumes"] + services["prometheus"]["volumes"]:
        assert (DOCKER / volume.split(":")[0]).exists(), volume
    assert "../helm/bert-triton/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://127.0.0.1:9090"
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/bert-triton.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"

    locust = services["locust"]
    command = locust["command"]
    assert command[command.index("-f") + 1] == "/mnt/project/loadtest/locustfile.py"  # by path
    assert "..:/mnt/project:ro" in locust["volumes"] and locust["environment"]["PYTHONPATH"] == "/mnt/project"
    assert locust["depends_on"]["triton"]["condition"] == "service_healthy"
    assert command[command.index("--host") + 1] == f"${{LOCUST_HOST:-http://127.0.0.1:{server.http_port}}}"
    assert command[command.index("--web-host") + 1] == "127.0.0.1"
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
