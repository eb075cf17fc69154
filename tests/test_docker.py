"""The images, the compose stack, the observability wiring and the pins of docker/versions.env.

No Docker daemon here, so the images are checked statically: hadolint on both Dockerfiles, every pinned
version against docker/versions.env wherever it is repeated (Dockerfiles, compose, chart, docs), the
build contexts and the compose file's structure. What runs for real, on the wheel's tritonserver 2.51: the
launcher started the way the server image starts it (docker/tritonserver.sh as TRITONSERVER_BIN), the
health check the image and the chart's readiness probe use (a killed Python stub included), the stages'
custom metrics and every metric the Grafana dashboard reads, and the engine cache with a stand-in builder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tomllib
import yaml

from client import TextClient
from export import sha256
from export.tensorrt import read_versions
from model_repository.settings import ROOT, load_settings
from model_repository.stages import stage_metrics
from model_repository.stages.stage_metrics import FLUSH_INTERVAL_S
from model_repository.stages.tokenization import load_tokenizer
from model_repository.triton_command import Ports
from model_repository.triton_install import (
    check_stub_python,
    check_tensorrt_plans,
    prepare_backends,
    stub_environment,
    triton_home,
    triton_libs,
)
from model_repository.watchdog import child_processes, stub_processes

DOCKER = ROOT / "docker"
CHART = ROOT / "helm" / "bert-triton"
DOCKERFILES = {name: DOCKER / f"{name}.Dockerfile" for name in ("server", "builder", "locust")}
VERSIONS = read_versions()
# Triton exports these through DCGM only where it sees a GPU (none here); names from Triton's metrics docs.
GPU_METRICS = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes", "nv_gpu_power_usage"}


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


healthcheck = load_module("healthcheck", DOCKER / "healthcheck.py")
engine_cache = load_module("engine_cache", DOCKER / "engine_cache.py")
bundle = load_module("bundle", ROOT / "helm" / "bundle.py")


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
    assert entrypoint[1:] == ["python3", "-m", "model_repository.server"]
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
    for package in ("numpy", "tokenizers", "onnxruntime", "tritonclient", "torch", "safetensors"):
        pinned = VERSIONS[f"{package.upper()}_VERSION"]
        if package in no_cp310_wheel:
            assert (
                pinned != pins[package]
                and f"{package} {pins[package]} needs Python >= 3.11" in (DOCKER / "versions.env").read_text()
            )
        else:
            assert pinned == pins[package], package
    assert VERSIONS["LOCUST_IMAGE"].endswith(f":{pins['locust']}")
    assert VERSIONS["AIOHTTP_VERSION"] == pins["aiohttp"]

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
    assert (DOCKER / settings_source).resolve() == ROOT / "model_repository" / "settings.toml"
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
    assert command[command.index("--settings") + 1] == "/mnt/project/${SETTINGS:-model_repository/settings.toml}"
    locustfile = ROOT / "loadtest" / "locustfile.py"
    if locustfile.exists():  # written alongside; the user class and the option the command names
        user = re.fullmatch(r"\$\{LOCUST_USER:-(\w+)\}", command[-1]).group(1)
        assert f"class {user}(" in locustfile.read_text() and '"--settings"' in locustfile.read_text()


# ---------------------------------------------------------------------------------------------------------
# Health check and metrics on the session's tritonserver
# ---------------------------------------------------------------------------------------------------------
def test_healthcheck_needs_a_real_inference(server):
    url = f"http://{server.http_url}"
    assert healthcheck.problem(url) is None
    assert healthcheck.main(["--url", url]) == 0
    assert "HTTP 404" in healthcheck.problem(url, model="no_such_model")
    assert "no answer" in healthcheck.problem("http://127.0.0.1:9", timeout_s=2)
    assert healthcheck.main(["--url", "http://127.0.0.1:9", "--timeout", "2"]) == 1


def test_stage_metrics_on_the_metrics_port(topology_server, exported, settings):
    """The stages' counts reach the metrics port within about a second (stage_metrics.FLUSH_INTERVAL_S), under
    the same names in both topologies, labelled with the model that counted them."""
    server = topology_server
    one_stage = server.settings.topology == "one_stage"
    tokenizing, encoding = ("ensemble", "ensemble") if one_stage else ("tokenizer", "encoder")
    texts = ["Triton batches requests dynamically.", "A second, somewhat longer text about tokenization.", "ok"]
    tokenizer = load_tokenizer(exported / "tokenizer.json", settings.model.max_tokens)
    tokens = sum(len(tokenizer.encode(text).ids) for text in texts)
    time.sleep(2 * FLUSH_INTERVAL_S)  # what earlier requests (the warm-up, other tests) counted is sent by now
    before = scrape(server.host, server.ports.metrics)
    with TextClient(server.grpc_url, "grpc") as client:
        client.embed(texts)  # one request, three texts

    def delta(name, **labels):
        return samples(after, name, **labels) - samples(before, name, **labels)

    deadline = time.monotonic() + 5 * FLUSH_INTERVAL_S
    while True:
        after = scrape(server.host, server.ports.metrics)
        # Each stub flushes on its own clock: in two stages the tokenizer's and the encoder's counts come apart.
        flushed = delta("bert_tokenizer_requests_total", model=tokenizing) and delta(
            "bert_encoder_padded_tokens_total", model=encoding
        )
        if flushed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert delta("bert_tokenizer_requests_total", model=tokenizing, version="1") == 1
    assert delta("bert_tokenizer_tokens_total", model=tokenizing) == tokens
    assert delta("bert_tokenizer_texts_per_execute_count", model=tokenizing) == 1
    assert delta("bert_tokenizer_texts_per_execute_sum", model=tokenizing) == len(texts)
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="2") == 0
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="4") == 1
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="+Inf") == 1
    assert delta("bert_encoder_sequences_per_execute_sum", model=encoding) == len(texts)
    assert delta("bert_encoder_real_tokens_total", model=encoding) == tokens
    # onnxruntime_cpu pads each chunk to its longest sequence: computed tokens >= real ones.
    padded = delta("bert_encoder_padded_tokens_total", model=encoding)
    assert tokens <= padded <= len(texts) * max(len(tokenizer.encode(t).ids) for t in texts)
    labels = re.search(r"^bert_encoder_real_tokens_total{(.*)}", after, flags=re.M).group(1)
    assert f'model_instance="{encoding}_0_0"' in labels
    # Buckets by powers of two up to the model's max_batch_size, cumulative, as a Prometheus histogram's.
    bounds = re.findall(rf'^bert_encoder_sequences_per_execute_bucket{{.*le="([^"]+)".*model="{encoding}"', after, re.M)
    limit = settings.ensemble.max_batch_size if one_stage else settings.encoder.max_batch_size
    assert sorted(bounds, key=lambda b: float(b)) == [str(2**i) for i in range(limit.bit_length())] + ["+Inf"]


class FailingMetrics:
    """A triton_python_backend_utils stand-in whose metrics fail: at creation, or at the first update."""

    def __init__(self, fail_on: str) -> None:
        self.warnings: list[str] = []
        self.Logger = types.SimpleNamespace(log_warn=self.warnings.append)
        fail_on_create = fail_on == "create"

        class Metric:
            def increment(self, value):
                raise RuntimeError("metric update failed")

            observe = increment

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

            def __init__(self, name, description, kind):
                if fail_on_create:
                    raise RuntimeError("custom metrics are not available")

            def Metric(self, labels, buckets=None):  # the Python backend's name
                return Metric()

        self.MetricFamily = MetricFamily


@pytest.mark.parametrize("fail_on", ["create", "update"])
@pytest.mark.parametrize("stage", ["text_encoder", "tokenizer", "encoder"])
def test_stage_metrics_never_fail_the_model(monkeypatch, stage, fail_on):
    fake = FailingMetrics(fail_on)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    module = load_module(f"stage_{stage}_{fail_on}", ROOT / "model_repository" / "stages" / f"{stage}.py")
    model = module.TritonPythonModel()
    args = {"model_name": stage, "model_version": "1", "model_instance_name": f"{stage}_0_0"}
    model.engine = types.SimpleNamespace(computed_tokens=24)
    model._create_metrics(args, 8)
    if stage == "encoder":
        model._record(2, 17)
        model._record(1, 5)
    else:
        model._record(2, np.array([9, 8]))
        model._record(1, np.array([], dtype=np.int64))
    model._metrics.flush()  # what the thread does each second: the failing update turns the metrics off, once
    model._metrics.flush()
    model.finalize()
    assert len(fake.warnings) == 1 and "custom metrics off" in fake.warnings[0]


def test_stage_metrics_send_histograms_as_cumulative_counters(monkeypatch):
    """Counts wait in the stub and go out in one flush: buckets cumulative, as Prometheus reads histograms."""
    sent: dict = {}

    class Metric:
        def __init__(self, key):
            self.key = key

        def increment(self, value):
            sent[self.key] = sent.get(self.key, 0) + value

    class Family:
        COUNTER = 0

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels):  # the Python backend's name
            return Metric((self.name, labels.get("le")))

    fake = types.SimpleNamespace(MetricFamily=Family, Logger=types.SimpleNamespace(log_warn=print))
    args = {"model_name": "m", "model_version": "1", "model_instance_name": "m_0_0"}
    declared = {"texts": ("t", "histogram", [1.0, 2.0, 4.0]), "requests": ("r", "counter", None)}
    metrics = stage_metrics.StageMetrics(fake, "m", args, declared, interval_s=3600)
    for value in (1, 3, 3, 9):
        metrics.add({"texts": value, "requests": 2})
    assert sent == {}, "nothing is sent per add()"
    metrics.flush()
    metrics.close()
    buckets = {le: value for (name, le), value in sent.items() if name == "texts_bucket"}
    assert buckets == {"1": 1, "2": 1, "4": 3, "+Inf": 4}, "cumulative, as Prometheus reads a histogram"
    assert sent[("texts_sum", None)] == 16 and sent[("texts_count", None)] == 4 and sent[("requests", None)] == 8
    assert stage_metrics.power_of_two_buckets(8) == [1, 2, 4, 8]
    assert stage_metrics.power_of_two_buckets(1000)[-1] == 1024.0


# ---------------------------------------------------------------------------------------------------------
# The launcher started the way the server image starts it
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_like_server(settings, repository, tmp_path_factory):
    """python3 -m model_repository.server with the image's environment, on the wheel's tritonserver.

    TRITONSERVER_BIN is docker/tritonserver.sh with TRITONSERVER_REAL_BIN and TRITONSERVER_EXTRA_ARGS as in
    the image; TRITON_BACKENDS_DIR a backends folder with the Python backend (the image's
    /opt/tritonserver/backends). The settings file only differs from the default in free ports.
    """
    work = tmp_path_factory.mktemp("image_like")
    ports = Ports.free()
    text = settings.path.read_text()
    names = ("http_port", "grpc_port", "metrics_port", "health_port", "triton_http_port")
    values = (ports.http, ports.grpc, ports.metrics, ports.health, ports.triton_http)
    for name, port in zip(names, values, strict=True):
        text, count = re.subn(rf"^{name} = \d+", f"{name} = {port}", text, flags=re.M)
        assert count == 1
    (work / "settings.toml").write_text(text)
    env = stub_environment()
    _, python_version = check_stub_python(env)
    env.update(
        TRITONSERVER_BIN=str(DOCKER / "tritonserver.sh"),
        TRITONSERVER_REAL_BIN=str(triton_home() / "bin" / "tritonserver"),
        TRITON_BACKENDS_DIR=str(prepare_backends(work, python_version)),
        TRITONSERVER_EXTRA_ARGS="--metrics-config=summary_latencies=true",
        LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(triton_libs()), os.environ.get("LD_LIBRARY_PATH")])),
    )
    command = [sys.executable, "-m", "model_repository.server", "--settings", str(work / "settings.toml")]
    command += ["--repository", str(repository), "--host", "127.0.0.1"]
    log = (work / "server.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{ports.http}"
    deadline = time.monotonic() + 120

    def launcher_ready() -> bool:  # the launcher answers /ready once Triton is ready and its watchdog runs
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports.health}/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    while healthcheck.problem(url, timeout_s=2) or not launcher_ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the image-like server did not come up:\n{(work / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield dataclasses.make_dataclass("ImageLike", ["process", "ports", "url", "settings"])(process, ports, url, text)
    process.kill()  # tritonserver follows its launcher (PR_SET_PDEATHSIG); a drain would wait for the dead stub
    process.wait()


def triton_process(launcher: int) -> tuple[int, str, list[bytes]]:
    """The launcher's one child that is not its HTTP front."""
    (child,) = [child for child in child_processes(launcher) if b"model_repository.front" not in child[2]]
    return child


def test_wrapper_passes_extra_flags_and_the_dashboard_metrics_exist(image_like_server, chart_dashboard_metrics):
    server = image_like_server
    # The launcher started tritonserver.sh, which exec'd tritonserver: the real binary.
    (_, _, cmdline) = triton_process(server.process.pid)
    assert Path(cmdline[0].decode()).name == "tritonserver"
    assert b"--metrics-config=summary_latencies=true" in cmdline
    assert cmdline.index(b"--metrics-config=summary_latencies=true") > cmdline.index(b"--log-verbose=0")

    with TextClient(f"127.0.0.1:{server.ports.http}", "http") as client:
        for _ in range(3):
            client.embed(["one request", "and another text"])
    metrics = scrape("127.0.0.1", server.ports.metrics)
    assert samples(metrics, "nv_inference_request_summary_us_count", model="ensemble") >= 3
    quantiles = set(re.findall(r'^nv_inference_request_summary_us{.*quantile="([^"]+)"', metrics, flags=re.M))
    assert {"0.5", "0.99"} <= quantiles

    exported = metric_names(metrics)
    exported |= {name.removesuffix(suffix) for name in exported for suffix in ("_bucket", "_sum", "_count")}
    missing = chart_dashboard_metrics - exported - GPU_METRICS
    assert not missing, f"the dashboard reads metrics tritonserver 2.51 does not export: {missing}"


@pytest.fixture(scope="module")
def chart_dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART / "dashboards" / "bert-triton.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {name for expr in exprs for name in re.findall(r"\b((?:nv|bert)_[a-z0-9_]+)\b", expr)}
    assert GPU_METRICS - {"nv_gpu_power_usage"} <= names
    return names


def test_chart_readiness_command_against_the_image_like_server(image_like_server):
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render({"settings": {"toml": image_like_server.settings}}, name="t", namespace="t")
    deployment = yaml.safe_load(rendered["bert-triton/templates/deployment.yaml"])
    command = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert command[command.index("--url") + 1] == image_like_server.url  # the port from the settings
    # The rendered command, with this checkout's interpreter and script in place of the image's.
    local = {"python3": sys.executable, "/opt/bert-triton/docker/healthcheck.py": str(DOCKER / "healthcheck.py")}
    run = subprocess.run([local.get(part, part) for part in command], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_a_dead_stub_is_reported_and_restarted_while_tritons_ready_says_200(image_like_server):
    """Triton 2.51 keeps /v2/health/ready at 200 with a dead stub; the launcher's /ready reports it until its
    watchdog has restarted the stage, and then a real inference (the chart's probe) passes (runs last)."""
    server = image_like_server
    (triton, _, _) = triton_process(server.process.pid)
    (stub,) = stub_processes(triton)["ensemble"]  # the one-stage model: tokenizer and encoder in one stub
    launcher_ready = f"http://127.0.0.1:{server.ports.health}/ready"
    os.kill(stub, signal.SIGKILL)
    reported, deadline = None, time.monotonic() + 30
    while reported is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(launcher_ready, timeout=5).close()
        except urllib.error.HTTPError as exc:
            reported = json.loads(exc.read())
            with urllib.request.urlopen(f"{server.url}/v2/health/ready", timeout=5) as response:
                assert response.status == 200  # Triton's own readiness does not notice
        time.sleep(0.02)
    assert reported and any("ensemble" in problem for problem in reported["problems"]), reported
    while time.monotonic() < deadline and healthcheck.problem(server.url):
        time.sleep(0.2)
    with urllib.request.urlopen(launcher_ready, timeout=5) as response:
        body = json.loads(response.read())
    assert body["ready"] and body["stub_restarts"][0]["model"] == "ensemble"
    assert healthcheck.main(["--url", server.url]) == 0
    assert stub_processes(triton)["ensemble"] != [stub]


# ---------------------------------------------------------------------------------------------------------
# Bundle and engine cache (the chart's TensorRT engine build), with a stand-in for the TensorRT builder
# ---------------------------------------------------------------------------------------------------------
H200 = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


class FakeBuilder:
    """Writes what export.tensorrt_build.build writes (a plan and its sidecar) for a given GPU."""

    def __init__(self, gpu: dict, version: str = "10.5.0.18") -> None:
        self.gpu, self.version, self.specs = gpu, version, []

    def __call__(self, spec: dict) -> dict:
        self.specs.append(spec)
        assert Path(spec["onnx"]).is_file()
        Path(spec["plan"]).write_bytes(b"plan for " + self.gpu["gpu_name"].encode())
        Path(spec["timing_cache"]).write_bytes(b"timings")
        sidecar = {"tensorrt_version": self.version, **self.gpu}
        sidecar.update({key: spec[key] for key in ("precision", "profiles", "onnx_sha256", "build_key")})
        Path(spec["plan"] + ".json").write_text(json.dumps(sidecar))
        return sidecar


@pytest.fixture()
def tensorrt_bundle(settings, exported, tmp_path):
    """A bundle for engine.kind tensorrt: the repository without a plan, engine/ with a spec and an ONNX model."""
    trt_settings = dataclasses.replace(
        settings,
        engine=dataclasses.replace(settings.engine, kind="tensorrt", precision="fp16"),
        encoder=dataclasses.replace(settings.encoder, gpus=(0,)),
    )
    root = tmp_path / "bundle"
    repository = bundle.write_repository(trt_settings, exported, root / "model_repository")
    engine = root / "engine"
    engine.mkdir()
    onnx = engine / "model.fp16.onnx"
    shutil.copyfile(exported / "model.onnx", onnx)
    spec = {"onnx": "build/models/x/model.fp16.onnx", "onnx_sha256": sha256(onnx), "plan": "build/models/x/model.plan",
            "inputs": ["input_ids", "attention_mask"], "precision": "fp16", "profiles": [], "workspace_mib": 1024,
            "optimization_level": 3, "timing_cache": "build/tensorrt_timing.cache", "build_key": "abc123"}  # fmt: skip
    (engine / engine_cache.SPEC_FILE).write_text(json.dumps(spec))
    return root, repository, spec


def test_bundle_for_tensorrt_leaves_the_plan_to_the_engine_build(tensorrt_bundle):
    _, repository, _ = tensorrt_bundle
    config = (repository / "encoder" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in config
    assert not list((repository / "encoder" / "1").iterdir()), "no plan (nor a placeholder) in the bundle"
    assert {p.name for p in repository.iterdir()} == {"tokenizer", "encoder", "ensemble"}


def test_bundle_for_other_engines_is_the_generated_repository(settings, exported, tmp_path):
    repository = bundle.write_repository(settings, exported, tmp_path / "model_repository")
    assert (repository / "ensemble" / "1" / "model.onnx").is_file()
    assert (repository / "ensemble" / "config.pbtxt").is_file()


def test_engine_cache_builds_once_per_gpu_product(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    cache = tmp_path / "cache"
    builder = FakeBuilder(H200)
    folder = engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert folder == cache / "NVIDIA-H200" / "tensorrt-10.5.0.18" / "abc123"
    assert (folder / "model.plan").read_bytes() == b"plan for NVIDIA H200"
    assert (folder.parent / "timing.cache").is_file()
    assert sorted(p.name for p in folder.parent.iterdir()) == [".lock", "abc123", "timing.cache"]  # no scratch left
    assert len(builder.specs) == 1 and builder.specs[0]["onnx"] == str(root / "engine" / "model.fp16.onnx")

    # Cached: a second pod of the same product builds nothing.
    again = engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert again == folder and len(builder.specs) == 1

    # Another product gets its own plan; a plan tuned on another GPU in this folder is rebuilt.
    h100 = FakeBuilder(H100)
    other = engine_cache.ensure_plan(spec, root / "engine", cache, H100["gpu_name"], H100, "10.5.0.18", h100)
    assert other.parent.parent.name == "NVIDIA-H100-80GB-HBM3" and len(h100.specs) == 1
    shutil.copyfile(other / "model.plan.json", folder / "model.plan.json")
    engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert len(builder.specs) == 2

    # Another TensorRT version: another folder.
    newer = engine_cache.ensure_plan(
        spec, root / "engine", cache, "NVIDIA-H200", H200, "10.6.0", FakeBuilder(H200, "10.6.0")
    )
    assert newer.parent.name == "tensorrt-10.6.0"


def test_engine_cache_refuses_an_onnx_model_the_spec_was_not_written_for(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    with pytest.raises(engine_cache.EngineCacheError, match="not the ONNX model"):
        engine_cache.ensure_plan(
            {**spec, "onnx_sha256": "0" * 64}, root / "engine", tmp_path, "X", H200, "10.5.0", FakeBuilder(H200)
        )


def test_assembled_repository_passes_the_launchers_plan_check(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    folder = engine_cache.ensure_plan(
        spec, root / "engine", tmp_path / "cache", "NVIDIA-H200", H200, "10.5.0.18", FakeBuilder(H200)
    )
    out = engine_cache.assemble(root / "model_repository", folder, tmp_path / "models" / "model_repository")
    assert (out / "encoder" / "1" / "model.plan").read_bytes() == b"plan for NVIDIA H200"
    check_tensorrt_plans(out, gpu_identity=lambda index: H200, tensorrt_version="10.5.0")
    with pytest.raises(Exception, match="tuned on NVIDIA H200"):
        check_tensorrt_plans(out, gpu_identity=lambda index: H100, tensorrt_version="10.5.0")
    # Assembling again (an init container restarted in the same pod) overwrites in place.
    engine_cache.assemble(root / "model_repository", folder, out)
    with pytest.raises(engine_cache.EngineCacheError, match="no tensorrt_plan encoder"):
        engine_cache.assemble(out / "tokenizer", folder, tmp_path / "elsewhere")


def test_product_labels_look_like_gpu_feature_discovery():
    assert engine_cache.product_label("NVIDIA H200") == "NVIDIA-H200"
    assert engine_cache.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert engine_cache.product_label("NVIDIA-H200") == "NVIDIA-H200"
    assert engine_cache.product_label(" Tesla T4/x ") == "Tesla-T4-x"
    with pytest.raises(engine_cache.EngineCacheError):
        engine_cache.product_label(" // ")


def test_tomllib_stand_in_reads_the_settings(monkeypatch):
    # The image installs tomli on Python 3.10; tomllib is the same parser, standing in for it here.
    monkeypatch.setitem(sys.modules, "tomli", tomllib)
    compat = load_module("compat_tomllib", DOCKER / "compat" / "tomllib.py")
    text = (ROOT / "model_repository" / "settings.toml").read_text()
    assert compat.loads(text) == tomllib.loads(text) and compat.TOMLDecodeError is tomllib.TOMLDecodeError
    assert load_settings().model.name == compat.loads(text)["model"]["name"]


def test_numpy_below_2_here_as_in_the_image():
    assert int(np.__version__.split(".")[0]) < 2 and VERSIONS["NUMPY_VERSION"] == np.__version__
