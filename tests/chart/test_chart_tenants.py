"""tenants.existingSecret: the keys file (serving/tenants.py) mounted read-only where the settings' tenants.keys_file
points, tritonserver's gRPC behind the launcher's gRPC front, and the API front sharing the rate buckets."""

from __future__ import annotations

import helm_python
import pytest

from tests.chart.helm import overlay, pod_spec, render, server_container

KEYS = "/var/run/secrets/bert-triton/tenants/keys.toml"


def with_tenants(**values) -> dict:
    return {**overlay("api-front"), "tenants": {"existingSecret": "bert-tenants", **values}}


def test_the_keys_secret_reaches_the_launcher_and_the_api_front(chart):
    objects = render(chart, with_tenants())
    spec = pod_spec(objects)
    (api,) = [c for c in spec["containers"] if c["name"] == "api"]
    triton = server_container(objects)
    for container in (triton, api):
        args = container["args"]
        assert f'tenants.keys_file="{KEYS}"' in args
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tenants"]
        assert mount == {"name": "tenants", "mountPath": KEYS.rsplit("/", 1)[0], "readOnly": True}
    assert triton["args"][triton["args"].index("--triton-grpc-port") + 1] == "8011"
    assert api["args"][api["args"].index("--grpc") + 1] == "127.0.0.1:8011"
    assert {"name": "shm", "mountPath": "/dev/shm"} in api["volumeMounts"]  # the buckets, shared
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tenants"]["secret"] == {
        "secretName": "bert-tenants",
        "items": [{"key": "keys.toml", "path": "keys.toml"}],
    }


def test_without_tenants_nothing_changes(chart):
    objects = render(chart, overlay("api-front"))
    spec = pod_spec(objects)
    assert "tenants" not in {v["name"] for v in spec["volumes"]}
    (api,) = [c for c in spec["containers"] if c["name"] == "api"]
    assert "--triton-grpc-port" not in server_container(objects)["args"]
    assert not any("tenants.keys_file" in arg for arg in api["args"])


def test_tenants_need_the_probes_key(chart):
    values = {"tenants": {"existingSecret": "bert-tenants"}}
    with pytest.raises(helm_python.HelmError, match=r"needs apiKey\.secret"):
        render(chart, values)
