"""The Helm chart checked without a cluster: strict lint, every manifest against the Kubernetes 1.29 and newest
schemas (kubernetes-validate), values.schema.json refusing bad values, and every value documented."""

from __future__ import annotations

import json
import re

import helm_python
import jsonschema
import kubernetes_validate
import pytest

from settings import ROOT
from tests.chart.helm import CHART, CONFIGS, KUBE_VERSIONS, overlay, render, with_settings

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
        # The default settings (BERT-base, 8 GPU stubs and the query lane's 1): 10 s of drain, then Triton's
        # 10 + 9 x 2 s.
        (
            {"terminationGracePeriodSeconds": 38},
            "terminationGracePeriodSeconds (38) must exceed 38 s: the launcher serves until quiet for up to"
            " server.exit_timeout_s (10), then Triton has its exit timeout (28: as long again, plus"
            " server.unload_s_per_stub for each of 9 Python stubs)",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_reason(chart, values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(chart, values)


def test_gpu_autoscaling_needs_settings_with_gpus(chart):
    values = {"autoscaling": {"enabled": True, "gpu": {"targetAverageUtilization": 70}}}
    cpu = {"settings": {"toml": (ROOT / "settings" / "defaults.toml").read_text()}}
    with pytest.raises(helm_python.HelmRenderError, match=re.escape('needs GPUs: engine.kind "auto"')):
        render(chart, {**cpu, **values})


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
