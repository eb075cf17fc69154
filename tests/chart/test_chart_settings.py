"""The settings file embedded in the chart's values drives it: ports, GPUs and /dev/shm rendered for every settings
file of the repository equal what settings reads from the same file, and the grace period outlasts the drain."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tomllib
import yaml

from serving.launcher.triton_command import SHM_DEFAULT_BYTES
from settings import ROOT, load_deployment, load_settings
from settings.deployment import SERVER_WIDE, python_stubs
from tests.chart.helm import (
    CHART,
    CONFIGS,
    GPU,
    GPU_ENGINES,
    OVERLAYS,
    SETTINGS_FILES,
    overlay,
    pod_spec,
    render,
    server_container,
    with_settings,
)


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

    stubs = python_stubs(settings)  # what Triton starts: the chart counts the same from the embedded file
    (shm,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["sizeLimit"] == f"{max(256, 64 * stubs)}Mi"
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


@pytest.mark.parametrize("config", [*CONFIGS, "gpu+reranker"])
def test_grace_period_and_tritons_exit_timeout_are_the_launchers(chart, config, tmp_path):
    """From SIGTERM to SIGKILL the launcher drains for up to server.exit_timeout_s, then tritonserver has its exit
    timeout (Deployment.triton_exit_timeout_s: as long again, plus server.unload_s_per_stub for each Python stub,
    which Triton unloads one by one): the chart derives the same from the settings files it embeds."""
    values = overlay(config) if "+" not in config else {**overlay("gpu"), **overlay("reranker")}
    objects = render(chart, values)
    (data,) = [c["data"] for c in objects["ConfigMap"] if "settings.toml" in c.get("data", {})]
    files = []
    for key in ["settings.toml", *sorted(k for k in data if re.fullmatch(r"model-\d+\.toml", k))]:
        files.append(tmp_path / key)
        files[-1].write_text(data[key])
    deployment = load_deployment(files)
    assert len(deployment.models) == 1 + len(values.get("extraModels", []))
    triton_exit_s = deployment.triton_exit_timeout_s
    assert pod_spec(objects)["terminationGracePeriodSeconds"] == deployment.server.exit_timeout_s + triton_exit_s + 10
    args = server_container(objects).get("args", [])
    if values.get("modelRepository", {}).get("source") == "objectStore":  # tritonserver without the launcher
        assert f"--exit-timeout-secs={triton_exit_s}" in args


def test_extra_models_are_served_beside_the_first(chart):
    """helm/values/reranker.yaml: the reranker's settings file beside the embedder's, one launcher for both; the
    probe checks each model, /dev/shm holds both models' stubs, the pod asks for the GPU they share."""
    embedder = load_settings(ROOT / "settings" / "variants" / "bert-base-h200.toml")
    reranker = load_settings(ROOT / "settings" / "variants" / "reranker-bert-base-h200.toml")
    objects = render(chart, {**overlay("gpu"), **overlay("reranker")})
    (config,) = objects["ConfigMap"]
    extra = tomllib.loads(config["data"]["model-1.toml"])
    assert extra["model"]["name"] == reranker.model.name and not set(SERVER_WIDE) & set(extra)
    files = ["--settings", "/etc/bert-triton/settings.toml", "/etc/bert-triton/model-1.toml"]
    for container in pod_spec(objects)["containers"]:  # the launcher and the API front
        assert container["args"][:3] == files, container["name"]
    probe = server_container(objects)["readinessProbe"]["exec"]["command"]
    assert [probe[i + 1] for i, word in enumerate(probe) if word == "--model"] == [
        embedder.model.name,
        reranker.model.name,
    ]
    stubs = sum(python_stubs(model) for model in (embedder, reranker))
    (shm,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["sizeLimit"] == f"{64 * stubs}Mi"
    assert server_container(objects)["resources"]["limits"][GPU] == 1  # both on GPU 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[server]\ngrpc_port = 9001\n", r"sets \[server\]: the server-wide sections are settings.toml's"),
        ('[engine]\nkind = "tensorrt"\n', "a TensorRT model is built by the engine build job"),
        ("", 'model.name "bert-base-random" is another model\'s'),
    ],
)
def test_an_extra_model_that_cannot_be_served_beside_the_first_is_refused(chart, extra, message):
    reranker = load_settings(ROOT / "settings" / "variants" / "reranker-bert-base-h200.toml")
    text = reranker.as_toml(SERVER_WIDE)
    if "kind" in extra:
        text = text.replace('kind = "torch"', 'kind = "tensorrt"')
    elif extra:
        text += "\n" + extra
    else:
        text = text.replace(f'name = "{reranker.model.name}"', 'name = "bert-base-random"')
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(chart, {"extraModels": [{"toml": text}]})
