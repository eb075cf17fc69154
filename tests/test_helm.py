"""The Helm chart, checked without a cluster: strict lint, rendering with every values file, Kubernetes schemas.

helm_python (Helm 4's SDK, no helm binary) lints and renders; kubernetes-validate checks every manifest
against the Kubernetes 1.29 and newest schemas it ships. The chart's shape (ports, GPUs, /dev/shm) comes from
the settings file embedded in its values, so the tests render it for every settings file of the repository
and compare with what settings reads from the same file.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import tomllib
import yaml
from kubernetes_validate.utils import latest_version

from serving.launcher.triton_command import SHM_DEFAULT_BYTES, Ports, server_command
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

# The Prometheus Operator's CRDs are not among kubernetes-validate's schemas. This is the part of the
# ServiceMonitor schema (monitoring.coreos.com/v1) that the chart uses, with the CRD's own patterns.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def chart():
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


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


# ---------------------------------------------------------------------------------------------------------
# Lint and schemas
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("config", CONFIGS)
def test_chart_lints_strictly(config, kube_version):
    report = helm_python.lint(CHART, overlay(config), strict=True, kube_version=f"v{kube_version}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


@pytest.mark.parametrize("config", CONFIGS)
def test_manifests_validate_against_kubernetes_schemas(chart, config):
    objects = render(chart, overlay(config))
    checked = 0
    for kind, docs in objects.items():
        if kind == "NOTES":
            continue
        for doc in docs:
            if kind == "ServiceMonitor":
                # A CRD: kubernetes-validate has no schema for it. Check the fields the chart uses instead.
                jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
                continue
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
            checked += 1
    assert checked >= 5


def test_values_schema_refuses_bad_values(chart):
    for bad in (
        {"modelRepository": {"source": "nfs"}},
        {"replicaCount": "two"},
        {"gpus": 2},  # unknown top-level key: the GPU count comes from the settings
        {"probes": {"liveness": {"mode": "tcp"}}},
        {"modelRepository": {"objectStore": {"uri": "https://bucket/path"}}},
        {"autoscaling": {"queueTime": {"metricName": "queue time"}}},
        {"autoscaling": {"gpu": {"metricName": "triton_gpu_utilization", "targetAverageUtilization": 150}}},
    ):
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(bad)
    chart.validate_schema(overlay("autoscaled"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"engineBuild": {"enabled": True}}, "needs engine.kind"),
        (
            {
                **with_settings(ROOT / "settings" / "variants" / "tensorrt-h200.toml"),
                "engineBuild": {"enabled": True},
                "modelRepository": {"source": "objectStore", "objectStore": {"uri": "s3://b/r"}},
            },
            "needs modelRepository.source = pvc",
        ),
        ({"modelRepository": {"source": "objectStore"}}, "objectStore.uri is required"),
        ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, "must not exceed"),
        ({"settings": {"toml": "[server]\nhttp_port = 9000\n"}}, "lacks [api] port"),
        ({"settings": {"toml": "[model\n"}}, "not valid TOML"),
        ({"terminationGracePeriodSeconds": 20}, "must exceed 2 x server.exit_timeout_s (20)"),
    ],
)
def test_inconsistent_values_fail_with_a_reason(chart, values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(chart, values)


def test_gpu_autoscaling_needs_settings_with_gpus(chart):
    values = {"autoscaling": {"enabled": True, "gpu": {"targetAverageUtilization": 70}}}
    cpu = {"settings": {"toml": (ROOT / "settings" / "defaults.toml").read_text()}}
    with pytest.raises(helm_python.HelmRenderError, match=re.escape('needs GPUs: engine.kind "onnxruntime_cpu"')):
        render(chart, {**cpu, **values})


# ---------------------------------------------------------------------------------------------------------
# The settings file drives the chart
# ---------------------------------------------------------------------------------------------------------
def test_values_files_embed_their_settings_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_settings", ROOT / "helm" / "sync_settings.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    assert set(sync.VALUES_FILES) == {CHART / "values.yaml", *OVERLAYS.values()}
    problems = [problem for problem in map(sync.stale, sync.VALUES_FILES) if problem]
    assert not problems, f"{problems}: run python helm/sync_settings.py"
    # The chart's default shape is the single-H200 benchmark's.
    assert (
        yaml.safe_load((CHART / "values.yaml").read_text())["settings"]["source"]
        == "settings/variants/bert-base-h200.toml"
    )
    # Rewriting from the source reproduces the file (the sync is idempotent).
    text = (CHART / "values.yaml").read_text()
    assert sync.with_settings(text, sync.resolved("settings/variants/bert-base-h200.toml")) == text


@pytest.mark.parametrize("settings_file", SETTINGS_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_chart_follows_the_settings_file(chart, settings_file):
    settings = load_settings(settings_file)
    objects = render(chart, with_settings(settings_file))
    container = server_container(objects)
    server = settings.server

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": server.http_port, "grpc": server.grpc_port, "metrics": server.metrics_port}
    (service,) = objects["Service"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports

    gpus = len(settings.encoder.gpus) if settings.engine.kind in GPU_ENGINES else 0
    resources = container["resources"]
    if gpus:
        assert resources["limits"][GPU] == resources["requests"][GPU] == gpus
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod_spec(objects)["tolerations"]
    else:
        assert GPU not in resources.get("limits", {}) and GPU not in resources.get("requests", {})
        assert "tolerations" not in pod_spec(objects)

    instances = settings.tokenizer.instances
    instances += settings.encoder.instances if settings.engine.kind != "tensorrt" else 0
    instances += settings.postprocess.instances if settings.model.task == "classification" else 0
    (shm,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["sizeLimit"] == f"{max(256, 64 * instances)}Mi"
    assert SHM_DEFAULT_BYTES < 64 << 20  # room beyond the launcher's pool per instance

    assert container["image"].endswith("-torch") == (settings.engine.kind == "torch")
    (config,) = objects["ConfigMap"]
    assert tomllib.loads(config["data"]["settings.toml"]) == tomllib.loads(settings.as_toml())


def test_ports_from_the_settings_reach_every_port(chart, tmp_path):
    text = (ROOT / "settings" / "defaults.toml").read_text()
    for name, port in (("http_port", 9100), ("grpc_port", 9101), ("metrics_port", 9102)):
        text = re.sub(rf"^{name} = \d+", f"{name} = {port}", text, flags=re.M)
    custom = tmp_path / "settings.toml"
    custom.write_text(text)
    assert dataclasses.astuple(load_settings(custom).server)[1:4] == (9100, 9101, 9102)
    objects = render(chart, {"settings": {"toml": text}, "networkPolicy": {"enabled": True}})
    container = server_container(objects)
    assert [p["containerPort"] for p in container["ports"]] == [9100, 9101, 9102]
    assert "http://127.0.0.1:9100" in container["readinessProbe"]["exec"]["command"]
    (policy,) = objects["NetworkPolicy"]
    assert [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"]] == [[9100, 9101], [9102]]
    (test_pod,) = objects["Pod"]
    assert "http://bert-bert-triton:9100" in test_pod["spec"]["containers"][0]["command"]


# ---------------------------------------------------------------------------------------------------------
# The server pod
# ---------------------------------------------------------------------------------------------------------
def test_probes_include_a_real_inference(chart):
    container = server_container(render(chart))
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load and warm-up take minutes
    assert liveness["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    readiness = container["readinessProbe"]
    command = readiness["exec"]["command"]
    assert command[:2] == ["python3", SERVER_IMAGE_HEALTHCHECK]
    assert command[command.index("--url") + 1] == "http://127.0.0.1:8000"
    assert command[command.index("--model") + 1] == "ensemble"
    assert int(command[command.index("--timeout") + 1]) < readiness["timeoutSeconds"]
    # tests/test_image_launcher.py runs this command against a live tritonserver, with a killed stub too.

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
        "--api-port", "0",
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


# ---------------------------------------------------------------------------------------------------------
# Autoscaling, monitoring, dashboards
# ---------------------------------------------------------------------------------------------------------
def test_autoscaled_overlay(chart):
    values = overlay("autoscaled")
    objects = render(chart, values)
    (deployment,) = objects["Deployment"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the replica count
    # settings/variants/bert-base-h200x2.toml: gpus [0, 1]
    assert server_container(objects)["resources"]["limits"][GPU] == 2

    (hpa,) = objects["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "bert-bert-triton"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    pods, cpu = hpa["spec"]["metrics"]
    assert pods["type"] == "Pods"
    assert pods["pods"]["metric"]["name"] == "triton_queue_duration_us_per_request"
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "3000"}
    assert cpu == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 75}},
    }
    assert "scaleDown" in hpa["spec"]["behavior"]

    (pdb,) = objects["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]

    (monitor,) = objects["ServiceMonitor"]
    (service,) = objects["Service"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}

    (dashboard,) = [c for c in objects["ConfigMap"] if c["metadata"]["name"].endswith("-dashboards")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "bert-triton.json").read_text())
    assert json.loads(dashboard["data"]["bert-triton.json"]) == shipped

    notes = objects["NOTES"][0]
    assert "triton_queue_duration_us_per_request" in notes and "nv_inference_queue_duration_us" in notes


def test_hpa_on_gpu_utilization(chart):
    """autoscaling.gpu: a third metric, the pods' mean nv_gpu_utilization (0..1) through prometheus-adapter."""
    values = {"autoscaling": {"enabled": True, "gpu": {"targetAverageUtilization": 70}}}
    objects = render(chart, values)  # the default settings: torch on one GPU
    (hpa,) = objects["HorizontalPodAutoscaler"]
    queue, gpu, cpu = hpa["spec"]["metrics"]
    assert queue["pods"]["metric"]["name"] == "triton_queue_duration_us_per_request"
    target = {"type": "AverageValue", "averageValue": "700m"}  # 70 %: 0.7 of nv_gpu_utilization's 0..1
    assert gpu == {"type": "Pods", "pods": {"metric": {"name": "triton_gpu_utilization"}, "target": target}}
    assert cpu["type"] == "Resource"
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    notes = objects["NOTES"][0]
    assert "triton_gpu_utilization (target 70 % GPU utilization)" in notes
    assert "avg_over_time(nv_gpu_utilization{<<.LabelMatchers>>}[2m])" in notes
    (default_hpa,) = render(chart, {"autoscaling": {"enabled": True}})["HorizontalPodAutoscaler"]
    assert [m["type"] for m in default_hpa["spec"]["metrics"]] == ["Pods", "Resource"]  # off by default


def test_prometheus_adapter_rule_matches_the_hpa():
    readme = (CHART / "README.md").read_text()
    (block,) = re.findall(r"```yaml\n(rules:.*?)```", readme, flags=re.S)
    rule, gpu_rule = yaml.safe_load(block)["rules"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]
    assert gpu_rule["name"]["as"] == defaults["gpu"]["metricName"]
    assert re.fullmatch(gpu_rule["name"]["matches"], "nv_gpu_utilization")
    assert "nv_gpu_utilization{<<.LabelMatchers>>}" in gpu_rule["metricsQuery"]
    assert set(gpu_rule["resources"]["overrides"]) == {"namespace", "pod"}
    notes_text = (CHART / "templates" / "NOTES.txt").read_text()
    assert gpu_rule["metricsQuery"] in notes_text and gpu_rule["seriesQuery"] in notes_text
    default_metric = yaml.safe_load((CHART / "values.yaml").read_text())["autoscaling"]["queueTime"]["metricName"]
    assert rule["name"]["as"] == default_metric == overlay("autoscaled")["autoscaling"]["queueTime"]["metricName"]
    assert re.fullmatch(rule["name"]["matches"], "nv_inference_queue_duration_us")
    query = rule["metricsQuery"]
    assert "rate(nv_inference_queue_duration_us{<<.LabelMatchers>>" in query
    assert "rate(nv_inference_request_success{<<.LabelMatchers>>" in query
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert query.split()[0] in notes and rule["seriesQuery"] in notes


def test_dashboard_covers_what_operators_watch():
    dashboard = json.loads((CHART / "dashboards" / "bert-triton.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for needle in (
        "nv_inference_request_success",  # throughput
        'quantile=~"0.5|0.99"',  # p50 / p99
        "nv_inference_queue_duration_us",  # queue time
        "nv_inference_compute_infer_duration_us",  # per-stage time
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "bert_gpu_sm_clock_hertz",  # NVML's, from the launcher: Triton exports no SM clock
        "bert_tokenizer_tokens_total",
        "bert_encoder_sequences_per_execute",
        "bert_encoder_padded_tokens_total",
    ):
        assert needle in exprs, needle
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "pod"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] if p["type"] != "row")
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    # tests/test_image_launcher.py checks every metric name here against a live tritonserver's metrics port.


# ---------------------------------------------------------------------------------------------------------
# Model repository: object store, TensorRT engine build
# ---------------------------------------------------------------------------------------------------------
def test_object_store_runs_tritonserver_with_the_launchers_flags(chart):
    values = overlay("cpu")
    objects = render(chart, values)
    container = server_container(objects)
    assert container["command"] == ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/bert-triton/docker/tritonserver.sh"]
    uri = values["modelRepository"]["objectStore"]["uri"]
    settings = load_settings(ROOT / "settings" / "defaults.toml")
    # Without the launcher there is no watchdog, hence no admin key and no explicit model control.
    launcher = server_command(
        Path("/opt/tritonserver/bin/tritonserver"),
        Path("/repository"),
        Path("/opt/tritonserver/backends"),
        dataclasses.replace(Ports.of(settings), triton_http=0),  # and no HTTP front: Triton's HTTP is the port
        "0.0.0.0",
        settings.server.exit_timeout_s,
    )[1:]
    assert launcher[0] == "--model-repository=/repository"
    assert container["args"] == [f"--model-repository={uri}", *launcher[1:]]
    assert container["envFrom"] == [{"secretRef": {"name": "bert-triton-s3"}}]
    assert container["image"] == "bert-triton-server:0.1.0-ngc24.10"
    assert GPU not in container["resources"]["limits"]
    assert {m["name"] for m in container["volumeMounts"]} == {"shm", "tmp"}
    (policy,) = objects["NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in policy["spec"]["egress"]


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


# ---------------------------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------------------------
def _documented_keys(values_text: str) -> dict[tuple[str, ...], bool]:
    """Key path -> whether a `# --` comment stands in the comment block right above it (values.yaml style)."""
    found: dict[tuple[str, ...], bool] = {}
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    block_indent = None  # inside a `|` block scalar (settings.toml)
    for line in values_text.splitlines():
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if not line.strip() or indent >= block_indent:
                continue
            block_indent = None
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = re.match(r"^(\s*)([A-Za-z_][\w.-]*):(.*)$", line)
        if not match or stripped.startswith("-"):
            comments = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        found[tuple(key for _, key in stack)] = any(c.startswith("# --") for c in comments)
        comments = []
        if match.group(3).strip() == "|":
            block_indent = indent + 1
    return found


def test_every_value_is_documented():
    schema = json.loads((CHART / "values.schema.json").read_text())
    undocumented = []
    for path, documented in _documented_keys((CHART / "values.yaml").read_text()).items():
        node = schema
        for key in path[:-1]:
            node = node.get("properties", {}).get(key, {})
        if "properties" not in node:
            continue  # inside a Kubernetes object passed through as is (resources, securityContext, ...)
        child = node["properties"].get(path[-1])
        assert child is not None, f"{'.'.join(path)} is not in values.schema.json"
        if child.get("type") == "object" and "properties" in child:
            continue  # a group: its members carry the documentation
        if not documented:
            undocumented.append(".".join(path))
    assert not undocumented, f"values.yaml keys without a `# --` comment: {undocumented}"


@pytest.mark.parametrize("config", CONFIGS)
def test_grace_period_outlasts_the_drain_and_tritons_exit(chart, config):
    """From SIGTERM to SIGKILL the launcher drains for up to server.exit_timeout_s, then tritonserver has as long
    again to finish (docs/reliability.md, Faults): the pod's grace period must hold both, for the settings it embeds."""
    objects = render(chart, overlay(config))
    (embedded,) = [c["data"]["settings.toml"] for c in objects["ConfigMap"] if "settings.toml" in c.get("data", {})]
    exit_timeout_s = tomllib.loads(embedded)["server"]["exit_timeout_s"]
    assert pod_spec(objects)["terminationGracePeriodSeconds"] > 2 * exit_timeout_s
