"""Autoscaling, monitoring and dashboards: the HPAs, the prometheus-adapter rule, the Grafana dashboard."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import yaml

from tests.chart.helm import CHART, GPU, KUBE_VERSIONS, overlay, render, server_container


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
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "pod", "model"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] if p["type"] != "row")
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
