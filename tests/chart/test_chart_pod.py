"""The server pod: probes with a real inference, unprivileged on a read-only root, the API front container, GPUs
and MIG slices."""

from __future__ import annotations

import re

import helm_python
import pytest

from settings import ROOT, load_deployment, load_settings
from tests.chart.helm import (
    CONFIGS,
    GPU,
    SERVER_IMAGE_HEALTHCHECK,
    SETTINGS_FILES,
    overlay,
    pod_spec,
    render,
    server_container,
    with_settings,
)


# ---------------------------------------------------------------------------------------------------------
# The server pod
# ---------------------------------------------------------------------------------------------------------
def test_probes_include_a_real_inference(chart):
    container = server_container(render(chart))
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load and warm-up take minutes
    # The launcher's /live, which its canary turns 503 for a hung tritonserver (Triton's own stays 200).
    assert liveness["httpGet"] == {"path": "/live", "port": load_settings(None).server.health_port}
    object_store = {"modelRepository": {"source": "objectStore", "objectStore": {"uri": "s3://b/r"}}}
    no_launcher = server_container(render(chart, object_store))["livenessProbe"]
    assert no_launcher["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    readiness = container["readinessProbe"]
    command = readiness["exec"]["command"]
    assert command[:2] == ["python3", SERVER_IMAGE_HEALTHCHECK]
    assert command[command.index("--url") + 1] == "http://127.0.0.1:8000"
    assert command[command.index("--model") + 1] == "ensemble"
    assert int(command[command.index("--timeout") + 1]) < readiness["timeoutSeconds"]
    # tests/server/test_image_launcher.py runs this command against a live tritonserver, with a killed stub too.

    inference_liveness = server_container(
        render(chart, {"probes": {"liveness": {"mode": "inference", "failureThreshold": 6}}})
    )["livenessProbe"]
    assert inference_liveness["exec"]["command"][:2] == ["python3", SERVER_IMAGE_HEALTHCHECK]


@pytest.mark.parametrize("config", CONFIGS)
def test_pods_run_unprivileged_on_a_read_only_root(chart, config):
    objects = render(chart, overlay(config))
    spec = pod_spec(objects)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"] + spec.get("initContainers", []):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in server_container(objects)["volumeMounts"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory" and mounts["/dev/shm"]["name"] == "shm"
    assert "emptyDir" in volumes["tmp"] and mounts["/tmp"]["name"] == "tmp"
    # Everything else the server mounts is read-only: /tmp and /dev/shm are its only writable paths.
    assert all(m.get("readOnly") for path, m in mounts.items() if path not in ("/tmp", "/dev/shm"))
    for job in objects.get("Job", []):
        assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_one_api_key_secret_reaches_every_container_that_serves_or_calls_inference(chart):
    objects = render(chart, overlay("api-front"))  # apiKey.secret: bert-api-key
    pods = [pod_spec(objects), *(pod["spec"] for pod in objects.get("Pod", []))]
    containers = [container for spec in pods for container in spec["containers"]]
    assert {container["name"] for container in containers} >= {"triton", "api", "inference"}
    for container in containers:
        (key,) = [entry for entry in container.get("env", []) if entry["name"] == "BERT_TRITON_API_KEY"]
        assert key["valueFrom"]["secretKeyRef"] == {"name": "bert-api-key", "key": "api-key"}, container["name"]
    plain = render(chart)
    assert not any(
        entry["name"] == "BERT_TRITON_API_KEY" for c in pod_spec(plain)["containers"] for entry in c.get("env", [])
    )


def test_api_front_runs_as_a_container_of_its_own(chart, settings):
    objects = render(chart, overlay("api-front"))
    spec = pod_spec(objects)
    (api,) = [c for c in spec["containers"] if c["name"] == "api"]
    args = dict(zip(api["args"][::2], api["args"][1::2], strict=True))
    server = settings.server  # the chart's default settings: settings/variants/bert-base-h200.toml
    h200 = load_settings(ROOT / "settings" / "variants" / "bert-base-h200.toml")
    assert api["command"] == ["python3", "-m", "serving.api"]
    assert args["--grpc"] == f"127.0.0.1:{h200.server.grpc_port}" and args["--port"] == str(h200.api.port)
    assert args["--ready-url"] == f"http://127.0.0.1:{server.health_port}/ready"
    assert args["--workers"] == str(h200.api.workers) and args["--repository"] == "/bundle/repository"
    assert args["--set"] == 'server.log_format="json"', "the chart's default log format, as the launcher's"
    assert api["ports"] == [{"name": "api", "containerPort": h200.api.port, "protocol": "TCP"}]
    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "api"}
    (key,) = api["env"]
    assert key["name"] == "BERT_TRITON_API_KEY" and key["valueFrom"]["secretKeyRef"]["name"] == "bert-api-key"
    # The launcher beside it runs no API front of its own.
    launcher = server_container(objects)["args"]
    assert launcher[launcher.index("--api-port") + 1] == "0"
    (service,) = objects["Service"]
    assert {"name": "api", "port": h200.api.port, "targetPort": "api", "protocol": "TCP", "appProtocol": "http"} in (
        service["spec"]["ports"]
    )
    # Off by default: no container, no port.
    default = render(chart)
    assert [c["name"] for c in pod_spec(default)["containers"]] == ["triton"]
    assert "api" not in {p["name"] for p in default["Service"][0]["spec"]["ports"]}


@pytest.mark.parametrize("settings_file", SETTINGS_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_api_container_reads_the_launchers_gpu_board_where_it_makes_one(chart, settings_file):
    """Where a model on GPUs has a query lane (Deployment.takes_gpu_turns) the launcher and the api container name
    one board file in the pod's shared /dev/shm, so that the front sends queries to the lane only while ingestion
    runs, as in one launcher; elsewhere neither names one, and the front sends every query to the lane."""
    objects = render(chart, with_settings(settings_file, **overlay("api-front")))
    spec = pod_spec(objects)
    (api,) = [c for c in spec["containers"] if c["name"] == "api"]
    launcher = server_container(objects)["args"]
    boards = [args[args.index("--gpu-board") + 1] for args in (launcher, api["args"]) if "--gpu-board" in args]
    if load_deployment([settings_file]).takes_gpu_turns:
        (shm,) = [v for v in spec["volumes"] if v["name"] == "shm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "shm", "mountPath": "/dev/shm"} in api["volumeMounts"]
        assert len(boards) == 2 and boards[0] == boards[1] and boards[0].startswith("/dev/shm/")
    else:
        assert boards == []


def test_api_front_needs_a_repository_on_a_volume(chart):
    values = {
        "apiFront": {"enabled": True},
        "modelRepository": {"source": "objectStore", "objectStore": {"uri": "s3://b/r"}},
    }
    with pytest.raises(helm_python.HelmRenderError, match=r"apiFront\.enabled needs the model repository on a volume"):
        render(chart, values)


def test_single_gpu_overlay_pins_the_gpu_product(chart):
    objects = render(chart, overlay("gpu"))
    spec, container = pod_spec(objects), server_container(objects)
    assert container["resources"]["limits"][GPU] == 1 == container["resources"]["requests"][GPU]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert spec["runtimeClassName"] == "nvidia"
    assert {m["mountPath"]: m.get("subPath") for m in container["volumeMounts"]}["/bundle"] == "bert-base-h200"
    assert container["args"] == [
        "--settings", "/etc/bert-triton/settings.toml", "--repository", "/bundle/repository", "--host", "0.0.0.0",
        "--log-format", "json", "--api-port", "0",
    ]  # fmt: skip
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITONSERVER_EXTRA_ARGS"] == "--metrics-config=summary_latencies=true"
    assert "PodDisruptionBudget" not in objects and "HorizontalPodAutoscaler" not in objects


def test_mig_overlay_asks_for_one_slice_where_slices_are(chart):
    """Single strategy: the slice is the device plugin's nvidia.com/gpu, on nodes GPU feature discovery labels with
    the sliced product; mixed: the profile's own resource. The count is the settings' encoder.gpus either way."""
    values = overlay("mig")
    objects = render(chart, values)
    spec, container = pod_spec(objects), server_container(objects)
    assert container["resources"]["limits"][GPU] == 1 == container["resources"]["requests"][GPU]
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H200-MIG-1g.18gb",
        "nvidia.com/mig.strategy": "single",
    }
    assert [t["key"] for t in spec["tolerations"]] == [GPU]
    assert objects["Deployment"][0]["spec"]["replicas"] == 7

    values["gpu"]["mig"]["strategy"] = "mixed"
    objects = render(chart, values)
    spec, container = pod_spec(objects), server_container(objects)
    assert container["resources"]["limits"] == {"memory": "10Gi", "nvidia.com/mig-1g.18gb": 1}
    assert (
        container["resources"]["requests"]["nvidia.com/mig-1g.18gb"] == 1
        and GPU not in container["resources"]["requests"]
    )
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/mig.strategy": "mixed"}

    values["gpu"]["mig"]["profile"] = ""
    with pytest.raises(helm_python.HelmRenderError, match=re.escape("gpu.mig.profile is required")):
        render(chart, values)
