"""The model repository from an object store, and TensorRT plans built in the cluster per GPU product."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from serving.launcher.triton_command import Ports, server_command
from settings import ROOT, Deployment, load_settings
from tests.chart.helm import GPU, overlay, pod_spec, render, server_container


# ---------------------------------------------------------------------------------------------------------
# Model repository: object store, TensorRT engine build
# ---------------------------------------------------------------------------------------------------------
def object_store_flags(settings, **extra) -> list[str]:
    """The launcher's tritonserver flags for an object store (no binary): no launcher, hence no watchdog, no
    admin key, no explicit model control, and no HTTP front (Triton's HTTP is the port)."""
    return server_command(
        Path("/opt/tritonserver/bin/tritonserver"),
        Path("/repository"),
        Path("/opt/tritonserver/backends"),
        dataclasses.replace(Ports.of(settings), triton_http=0),
        "0.0.0.0",
        Deployment.of(settings).triton_exit_timeout_s,
        **extra,
    )[1:]


def test_object_store_runs_tritonserver_with_the_launchers_flags(chart):
    values = overlay("cpu")
    objects = render(chart, values)
    container = server_container(objects)
    assert container["command"] == ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/bert-triton/docker/tritonserver.sh"]
    uri = values["modelRepository"]["objectStore"]["uri"]
    launcher = object_store_flags(load_settings(ROOT / "settings" / "defaults.toml"))
    assert launcher[0] == "--model-repository=/repository"
    assert container["args"] == [f"--model-repository={uri}", *launcher[1:]]
    assert container["envFrom"] == [{"secretRef": {"name": "bert-triton-s3"}}]
    assert container["image"] == "bert-triton-server:0.1.0-ngc24.10"
    assert GPU not in container["resources"]["limits"]
    assert {m["name"] for m in container["volumeMounts"]} == {"shm", "tmp"}
    (policy,) = objects["NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in policy["spec"]["egress"]


def test_object_store_with_an_api_key_restricts_inference_as_the_launcher_does(chart):
    values = copy.deepcopy(overlay("cpu"))
    values["apiKey"] = {"secret": "bert-api-key", "secretKey": "api-key"}
    container = server_container(render(chart, values))
    # Kubernetes puts the Secret's value where $(BERT_TRITON_API_KEY) stands when the container starts.
    launcher = object_store_flags(load_settings(ROOT / "settings" / "defaults.toml"), api_key="$(BERT_TRITON_API_KEY)")
    assert container["args"][1:] == launcher[1:]
    assert any(entry["name"] == "BERT_TRITON_API_KEY" for entry in container["env"])


def test_an_object_store_tritonserver_runs_the_rate_limiter_that_warm_first_asks_for(chart):
    """gpu.yaml (BERT-base, 8 instances, encoder.warm_first): Triton honours the instance priorities only with its
    rate limiter on, as the launcher turns it on."""
    values = copy.deepcopy(overlay("gpu"))
    values["modelRepository"] = copy.deepcopy(overlay("cpu")["modelRepository"])
    container = server_container(render(chart, values))
    settings = load_settings(ROOT / values["settings"]["source"])
    deployment = Deployment.of(settings)
    assert deployment.rate_limited
    launcher = object_store_flags(settings, uses_gpus=True, rate_limited=True)
    assert "--rate-limit=execution_count" in launcher
    assert container["args"][1:] == launcher[1:]


def test_tracing_reaches_the_launcher_the_api_front_and_an_object_store_tritonserver(chart):
    tracing = {"endpoint": "http://otel-collector.observability:4318", "sampleRate": 0.05, "serviceName": "rag"}
    tracing["tritonSpans"] = True
    overrides = [
        "--set", 'tracing.endpoint="http://otel-collector.observability:4318"',
        "--set", "tracing.sample_rate=0.05", "--set", 'tracing.service_name="rag"',
        "--set", "tracing.triton_spans=true",
    ]  # fmt: skip
    api = [c for c in pod_spec(render(chart, {**overlay("api-front"), "tracing": tracing}))["containers"]]
    for container in api:
        args = container["args"]
        assert any(args[i : i + len(overrides)] == overrides for i in range(len(args))), container["name"]
    values = copy.deepcopy(overlay("cpu"))
    values["tracing"] = tracing
    container = server_container(render(chart, values))
    settings = load_settings(ROOT / "settings" / "defaults.toml", [f'tracing.{k}' for k in (
        'endpoint="http://otel-collector.observability:4318"', "sample_rate=0.05", 'service_name="rag"',
        "triton_spans=true")])  # fmt: skip
    launcher = object_store_flags(settings, tracing=settings.tracing)
    assert container["args"][1:] == launcher[1:]
    assert "--trace-config=rate=20" in launcher


def test_gcs_credentials_come_as_a_mounted_key_file(chart):
    values = copy.deepcopy(overlay("cpu"))
    values["modelRepository"]["objectStore"] = {
        "uri": "gs://models/bert/model_repository",
        "credentialsSecret": "gcs-key",
        "gcsCredentialsKey": "key.json",
    }
    objects = render(chart, values)
    container = server_container(objects)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/secrets/bert-triton/object-store/key.json"
    assert "envFrom" not in container
    (volume,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "object-store-credentials"]
    assert volume["secret"] == {"secretName": "gcs-key", "items": [{"key": "key.json", "path": "key.json"}]}


def test_tensorrt_overlay_builds_plans_per_gpu_product(chart):
    objects = render(chart, overlay("tensorrt"))
    spec = pod_spec(objects)
    (init,) = spec["initContainers"]
    assert init["image"] == "bert-triton-engine-builder:0.1.0-ngc24.10"
    assert init["command"][1:] == [
        "python3", "/opt/bert-triton/docker/engine_cache.py", "--bundle", "/bundle", "--cache", "/engine-cache",
        "--out", "/models/repository",
    ]  # fmt: skip
    assert init["resources"]["limits"][GPU] == 1  # builds on the pod's own GPU
    assert {"name": "GPU_PRODUCT", "value": "NVIDIA-H200"} in init["env"]
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert init_mounts["/bundle"]["readOnly"] and not init_mounts["/models"].get("readOnly")

    container = server_container(objects)
    assert container["args"][container["args"].index("--repository") + 1] == "/models/repository"
    assert container["image"] == "bert-triton-server:0.1.0-ngc24.10"  # no torch for a TensorRT encoder
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["engine-cache"]["persistentVolumeClaim"]["claimName"] == "bert-bert-triton-engine-cache"
    assert "emptyDir" in volumes["models"]

    (job,) = objects["Job"]
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    job_container = job["spec"]["template"]["spec"]["containers"][0]
    assert job_container["command"] == init["command"][:-2]  # the same build, cache only
    assert job_container["resources"]["limits"][GPU] == 1
    (claim,) = objects["PersistentVolumeClaim"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    assert int(claim["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_tracing_leaves_tritonserver_s_own_spans_off_unless_asked(chart):
    """Triton 2.51 crashes with its tracing on under load (upstream server issue 7795): the fronts trace, the
    object store's tritonserver (started by the chart itself) does not, until tracing.tritonSpans says so."""
    values = copy.deepcopy(overlay("cpu"))
    values["tracing"] = {"endpoint": "http://otel-collector:4318", "sampleRate": 0.01, "serviceName": "rag"}
    values["tracing"]["tritonSpans"] = False
    args = server_container(render(chart, values))["args"]
    assert not any(arg.startswith("--trace-config") for arg in args)
