"""The images of the local base, run (make image-test; make image builds them: docker/build_local.sh).

Not collected by `make test` (the name is not test_*.py): make image-test names this file. On the host's network,
every port on 127.0.0.1, in this order:

1. the server image as the chart runs it (tests/image/containers.py run_server), its start watched: the healthcheck
   fails until /v1 answers, and Docker's own runs of the image's HEALTHCHECK fail while /v1 does not;
2. non-root, read-only root; every pin of docker/versions.env against what the images hold;
3. the OpenAI SDK on /v1/embeddings against sentence-transformers fp32 on the same texts (cosine >= 0.9999), naming
   the engine the image chose; KServe gRPC through the project's client and tritonclient; the healthcheck inside;
4. Locust from its image, headless, against gRPC;
5. docker stop (SIGTERM) under load: every request answered, exit 0 within the chart's grace period;
6. docker-compose up of docker/compose.yaml with these images: no GPU file, no observability profile.

Nothing skips: without a daemon, the images or the bundle, each test fails saying why. The figures go to
build/image-test/results.json (docs/results/cpu-2026-12-05/images/README.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tomllib

from export.checkpoint import resolve_source
from settings import ROOT, load_deployment, load_settings
from tests.image.containers import (
    API,
    BUNDLE,
    DOCKER,
    GRPC,
    HOST,
    LOCUST_IMAGE,
    NAME,
    OUT,
    SERVER_IMAGE,
    Load,
    busy_ports,
    docker,
    inspect,
    run_server,
    wall,
    watch_start,
)
from tests.support import VERSIONS

RESULTS: dict = {}
TEXTS = [
    *(ROOT / "export" / "validation_sentences.txt").read_text().splitlines(),
    "Il pleut à Paris depuis ce matin.",
    "x",
    "Triton batches requests of different lengths. " * 60,  # over the model's 256 tokens: truncated alike
]


@pytest.fixture(scope="module", autouse=True)
def results():
    """The figures of the run, written when the module ends, whatever failed."""
    yield RESULTS
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


@pytest.fixture(scope="module")
def server():
    """The server container, started here and watched until Docker calls it healthy; removed at the end."""
    if docker("info", check=False).returncode:
        pytest.fail(f"no Docker daemon answers {DOCKER}: run `make image-test` (docker/start_dockerd.sh starts one)")
    for image in (SERVER_IMAGE, LOCUST_IMAGE):
        if docker("image", "inspect", image, check=False).returncode:
            pytest.fail(f"{image} is missing: run `make image` first")
    if not (BUNDLE / "settings.toml").is_file():
        pytest.fail(f"{BUNDLE} holds no bundle: run `make image-test`, which makes it (make bundle)")
    bundled = tomllib.loads((BUNDLE / "settings.toml").read_text())["model"]
    if bundled["source"] != load_settings().model.source:
        pytest.fail(f"{BUNDLE} serves {bundled['source']}, not the defaults: run `make image-test` without SETTINGS")
    if busy := busy_ports():
        pytest.fail(f"something listens on 127.0.0.1:{busy}: the image serves the default ports; stop it first")
    docker("rm", "--force", NAME, check=False)
    began = time.time()
    run_server()
    start = watch_start(began)
    RESULTS["start"] = {"healthy_s": start.healthy_s, "samples": start.samples}
    yield start
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "server.log").write_text(docker("logs", NAME, check=False).stderr)
    docker("rm", "--force", NAME, check=False)


def exec_python(container: str, code: str) -> str:
    return docker("exec", container, "python3", "-c", code).stdout


def test_healthcheck_fails_until_v1_answers(server):
    samples = server.samples
    assert all(answered for _, reason, answered in samples if reason is None), "healthy while /v1 did not answer"
    assert any(reason for _, reason, _ in samples), "no sample before the server answered: nothing was shown"
    last_unanswered = max((server.began + t for t, _, answered in samples if not answered), default=server.began)
    before = [check for check in server.checks.values() if wall(check["End"]) < last_unanswered]
    assert before and all(check["ExitCode"] != 0 for check in before), before
    RESULTS["start"].update(
        healthcheck_failed_while_v1_did_not_answer=sum(1 for _, reason, answered in samples if reason and not answered),
        docker_checks_failed_before_v1=len(before),
        v1_answered_s=min(t for t, _, answered in samples if answered),
    )


def test_runs_non_root_with_a_read_only_root(server):
    container = inspect(NAME)
    assert container["Config"]["User"] == "10001:10001" and container["HostConfig"]["ReadonlyRootfs"] is True
    assert container["HostConfig"]["NetworkMode"] == "host"
    assert {m["Destination"]: m["RW"] for m in container["Mounts"]} == {
        "/bundle": False,
        "/etc/bert-triton/settings.toml": False,
    }
    assert docker("exec", NAME, "id", "-u").stdout.strip() == "10001"
    refused = docker("exec", NAME, "touch", "/opt/bert-triton/x", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr


# Where each pin of docker/versions.env is checked in the running images, or why it does not apply to them.
SERVER_PINS = {
    "NUMPY_VERSION": "numpy",
    "TOKENIZERS_VERSION": "tokenizers",
    "LOCAL_ONNXRUNTIME_VERSION": "onnxruntime",
    "TRITONCLIENT_VERSION": "tritonclient",
    "GRPCIO_VERSION": "grpcio",
    "AIOHTTP_VERSION": "aiohttp",
    "ORJSON_VERSION": "orjson",
    "OPENTELEMETRY_VERSION": "opentelemetry-sdk",
    "NVIDIA_ML_PY_VERSION": "nvidia-ml-py",
}
LOCUST_PINS = {
    "LOCUST_VERSION": "locust",
    "NUMPY_VERSION": "numpy",
    "TOKENIZERS_VERSION": "tokenizers",
    "TRITONCLIENT_VERSION": "tritonclient",
    "AIOHTTP_VERSION": "aiohttp",
}
ABSENT = {"TOMLI_VERSION": "tomli", "TORCH_VERSION": "torch", "SAFETENSORS_VERSION": "safetensors"}
ELSEWHERE = {
    "TRITON_VERSION": "tritonserver's own server metadata",
    "PYTRITON_VERSION": "the wheel's METADATA in /opt/tritonserver",
    "DEBIAN_RELEASE": "/etc/os-release",
    "TENSORRT_VERSION": "none: no libnvinfer in the image, TRT_VERSION empty",
    "LOCAL_PYTHON_IMAGE": "the local base's base (its label)",
    "LOCAL_BASE_IMAGE": "the server image's base (its label)",
    "LOCAL_IMAGE_TAG": "the tag of the images run here",
    "NGC_RELEASE": "NGC only",
    "TRITONSERVER_IMAGE": "NGC only",
    "TENSORRT_IMAGE": "NGC only",
    "IMAGE_TAG": "the NGC images' tag",
    "ONNXRUNTIME_VERSION": "NGC's Python 3.10 only (LOCAL_ONNXRUNTIME_VERSION here)",
    "PROMETHEUS_IMAGE": "Docker Hub: not pulled here",
    "GRAFANA_IMAGE": "Docker Hub: not pulled here",
    "LOCUST_IMAGE": "Docker Hub: not pulled here (LOCUST_VERSION is checked)",
}
VERSIONS_OF = (
    "import importlib.metadata as m, json, sys\n"
    "def version(name):\n"
    "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return None\n"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], **{n: version(n) for n in sys.argv[1:]}}))"
)


def test_every_pin_is_what_the_images_hold(server):
    assert set(SERVER_PINS) | set(LOCUST_PINS) | set(ABSENT) | set(ELSEWHERE) == set(VERSIONS), "a pin placed nowhere"
    names = [*SERVER_PINS.values(), "opentelemetry-exporter-otlp-proto-http", *ABSENT.values()]
    held = json.loads(docker("exec", NAME, "python3", "-c", VERSIONS_OF, *names).stdout)
    locust = json.loads(
        docker("run", "--rm", "--network", "host", "--entrypoint", "python3", LOCUST_IMAGE, "-c", VERSIONS_OF,
               *LOCUST_PINS.values()).stdout
    )  # fmt: skip
    for pin, package in SERVER_PINS.items():
        assert held[package] == VERSIONS[pin], f"server image: {package} {held[package]} != {pin}"
    assert held["opentelemetry-exporter-otlp-proto-http"] == VERSIONS["OPENTELEMETRY_VERSION"]
    for pin, package in LOCUST_PINS.items():
        assert locust[package] == VERSIONS[pin], f"Locust image: {package} {locust[package]} != {pin}"
    assert all(held[package] is None for package in ABSENT.values()), held  # tomllib: Python 3.11
    assert held["python"] == locust["python"] == "3.11"

    import tritonclient.grpc as grpcclient

    metadata = grpcclient.InferenceServerClient(GRPC).get_server_metadata(as_json=True)
    assert metadata["version"] == VERSIONS["TRITON_VERSION"]
    wheel = docker("exec", NAME, "sh", "-c", "cat /opt/tritonserver/nvidia_pytriton-*.dist-info/METADATA").stdout
    assert re.search(r"^Version: (\S+)$", wheel, flags=re.M).group(1) == VERSIONS["PYTRITON_VERSION"]
    release = docker("exec", NAME, "sh", "-c", ". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    assert release == VERSIONS["DEBIAN_RELEASE"]
    no_tensorrt = '! ls /usr/lib/*-linux-gnu/libnvinfer* 2> /dev/null && [ -z "${TRT_VERSION:-}" ]'
    assert docker("exec", NAME, "sh", "-c", no_tensorrt, check=False).returncode == 0
    base = "org.opencontainers.image.base.name"
    assert inspect(SERVER_IMAGE)["Config"]["Labels"][base] == VERSIONS["LOCAL_BASE_IMAGE"]
    assert inspect(VERSIONS["LOCAL_BASE_IMAGE"])["Config"]["Labels"][base] == VERSIONS["LOCAL_PYTHON_IMAGE"]
    RESULTS["versions"] = {"server": held, "locust": locust, "tritonserver": metadata["version"], "debian": release}


def test_openai_sdk_matches_sentence_transformers(server):
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    served = OpenAI(base_url=f"{API}/v1", api_key="unused").embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
    vectors = np.array([row.embedding for row in served.data], dtype=np.float32)
    folder = resolve_source(load_settings().model.source)
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True)
    cosine = (vectors * reference).sum(axis=1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    with urllib.request.urlopen(f"{API}/info", timeout=10) as response:
        info = json.loads(response.read())
    RESULTS["openai"] = {
        "texts": len(TEXTS),
        "min_cosine": float(cosine.min()),
        "engine": info["engine"],
        "dtype": info["model_dtype"],
        "reference": "sentence-transformers fp32, CPU",
    }
    assert cosine.min() >= 0.9999, cosine
    assert (info["engine"], info["model_dtype"]) == ("onnxruntime_cpu", "fp32")  # no torch in the image
    RESULTS["vectors"] = vectors.tolist()


def test_kserve_grpc_through_the_projects_client_and_tritonclient(server):
    import tritonclient.grpc as grpcclient

    from client import TextClient

    with TextClient(GRPC) as client:
        rows = client.embed(TEXTS)
    np.testing.assert_allclose(rows, np.array(RESULTS.pop("vectors")), atol=1e-5)  # the same model as /v1
    triton = grpcclient.InferenceServerClient(GRPC)
    assert triton.is_server_ready() and triton.is_model_ready("ensemble")
    assert [tensor["name"] for tensor in triton.get_model_metadata("ensemble", as_json=True)["inputs"]] == ["text"]
    RESULTS["grpc"] = {"texts": len(rows), "max_abs_diff_to_v1": "<= 1e-5"}


def test_healthcheck_inside_the_image(server):
    assert inspect(NAME)["State"]["Health"]["Status"] == "healthy"
    command = inspect(SERVER_IMAGE)["Config"]["Healthcheck"]["Test"]
    assert command == ["CMD", "python3", "/opt/bert-triton/docker/healthcheck.py", "--api-url", API]
    assert docker("exec", NAME, *command[1:], check=False).returncode == 0


def test_locust_from_its_image(server, tmp_path):
    """The project's load test from the Locust image, 8 gRPC users for 20 s. The settings' acceptance bar is for
    a server with the machine to itself; here Locust shares its cores, so failures are held to 0, the rest reported."""
    tmp_path.chmod(0o777)  # the image's user writes the summary
    run = docker(
        "run", "--rm", "--network", "host", "--volume", f"{ROOT}:/mnt/project:ro", "--volume", f"{tmp_path}:/out",
        "--env", "PYTHONPATH=/mnt/project", "--workdir", "/mnt/project", LOCUST_IMAGE,
        "-f", "/mnt/project/loadtest/locustfile.py", "--headless", "--users", "8", "--spawn-rate", "8",
        "--run-time", "20s", "--host", GRPC, "--settings", "/mnt/project/settings/defaults.toml",
        "--accept-p50-ms", "10000", "--accept-p99-ms", "30000", "--accept-min-rps", "1",
        "--accept-max-fail-ratio", "0", "--summary-json", "/out/summary.json", "GrpcTextUser",
        check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    total = json.loads((tmp_path / "summary.json").read_text())["total"]
    RESULTS["locust"] = {key: total[key] for key in ("requests", "failures", "rps", "p50_ms", "p99_ms")}
    assert total["requests"] > 0 and total["failures"] == 0


def test_sigterm_under_load_loses_nothing(server):
    deployment = load_deployment([BUNDLE / "settings.toml"])
    grace_s = deployment.first.server.exit_timeout_s + deployment.triton_exit_timeout_s + 10  # the chart's
    load = Load().start()
    time.sleep(5)
    sigterm = time.time()
    stop = docker("stop", "--time", str(grace_s), NAME, timeout=grace_s + 30)
    stopped_s = time.time() - sigterm
    load.stop.set()
    load.join(35)
    state = inspect(NAME)["State"]
    failed = [outcome for outcome in load.outcomes if outcome.error]
    in_flight = [outcome for outcome in load.outcomes if outcome.start < sigterm < outcome.end]
    RESULTS["sigterm"] = {
        "requests": len(load.outcomes),
        "grpc": sum(1 for outcome in load.outcomes if outcome.kind == "grpc"),
        "api": sum(1 for outcome in load.outcomes if outcome.kind == "api"),
        "failed": len(failed),
        "in_flight_at_sigterm": len(in_flight),
        "answered_after_sigterm": sum(1 for outcome in load.outcomes if outcome.end > sigterm),
        "unready_after_s": round(load.unready_at - sigterm, 2) if load.unready_at else None,
        "exit_code": state["ExitCode"],
        "stopped_s": round(stopped_s, 2),
        "grace_s": grace_s,
    }
    assert stop.returncode == 0 and not state["Running"] and state["ExitCode"] == 0, state
    assert stopped_s < grace_s and not state["OOMKilled"]
    assert not failed, failed[:5]
    assert len(load.outcomes) > 50 and in_flight, RESULTS["sigterm"]


def test_compose_serves_without_gpu_or_observability(tmp_path):
    """docker-compose up -d of docker/compose.yaml with these images (build/repository, the defaults); a Locust swarm
    from its web UI for 10 s; then down."""
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose is missing (docker/start_dockerd.sh installs it)"
    env = {
        **os.environ,
        "SERVER_IMAGE": SERVER_IMAGE,
        "LOCUST_LOCAL_IMAGE": LOCUST_IMAGE,
        "SETTINGS": "settings/defaults.toml",
    }
    base = [compose, "-p", "bert-triton-image-test", "--env-file", "docker/versions.env", "-f", "docker/compose.yaml"]

    def run(*args: str, timeout: float = 180):
        done = subprocess.run([*base, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run("up", "--detach", "--no-build")
    try:
        running = docker("ps", "--filter", "label=com.docker.compose.project=bert-triton-image-test", "--format",
                         '{{.Label "com.docker.compose.service"}}').stdout.split()  # fmt: skip
        assert sorted(running) == ["locust", "triton"], running  # no Prometheus, no Grafana
        triton = run("ps", "-q", "triton").stdout.strip()
        deadline = time.time() + 240
        while inspect(triton)["State"]["Health"]["Status"] != "healthy" and time.time() < deadline:
            time.sleep(2)
        assert inspect(triton)["State"]["Health"]["Status"] == "healthy"
        swarm = urllib.parse.urlencode({"user_count": 4, "spawn_rate": 4}).encode()
        deadline = time.time() + 120  # Locust starts once Triton is healthy
        while True:
            try:
                urllib.request.urlopen(f"http://{HOST}:8089/swarm", swarm, timeout=5).close()
                break
            except OSError:
                assert time.time() < deadline, "Locust's web UI did not answer"
                time.sleep(2)
        time.sleep(10)
        with urllib.request.urlopen(f"http://{HOST}:8089/stats/requests", timeout=5) as response:
            total = next(row for row in json.loads(response.read())["stats"] if row["name"] == "Aggregated")
        RESULTS["compose"] = {"requests": total["num_requests"], "failures": total["num_failures"]}
        urllib.request.urlopen(f"http://{HOST}:8089/stop", b"", timeout=5).close()
        assert total["num_requests"] > 0 and total["num_failures"] == 0, total
    finally:
        run("down", "--timeout", "60")
