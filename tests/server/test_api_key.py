"""One API key for every way in (protocol/api_key.py), on the real launcher: with BERT_TRITON_API_KEY set, an
inference without the key, or with a wrong one, is refused on the API front, the HTTP front and Triton's gRPC;
with it, the client library (gRPC and HTTP), the API and the healthcheck pass; health, readiness and metrics
stay open."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import grpc
import httpx
import pytest

from client import ClientError, TextClient
from client.core import RetryPolicy
from common.contract import TEXT_INPUT
from protocol.api_key import API_KEY_ENV, headers
from protocol.kserve_grpc import MODEL_INFER, model_infer_request
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import ROOT

KEY = "s3cret-key"
WRONG = ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY}"})


@pytest.fixture(scope="module")
def keyed(settings, repository, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_ENV, KEY)  # the launcher's environment, which its children inherit
        started = Launcher(settings.path, repository, Ports.free(), tmp_path_factory.mktemp("keyed") / "log").start()
    yield started
    started.kill()


def kserve_body(text: str) -> dict:
    return {"inputs": [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}


def grpc_status(port: int, metadata: dict) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)
        try:
            call(model_infer_request("ensemble", ["hello"]), timeout=30, metadata=tuple(metadata.items()))
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_every_port_refuses_inference_without_the_key(keyed, settings):
    ports = keyed.ports
    for sent in WRONG:
        api = httpx.post(f"http://127.0.0.1:{ports.api}/v1/embeddings", json={"input": "a"}, headers=sent)
        assert api.status_code == 401, api.text
        http = httpx.post(
            f"http://127.0.0.1:{ports.http}/v2/models/ensemble/infer", json=kserve_body("a"), headers=sent
        )
        assert http.status_code == 401 and "API key" in http.json()["error"], http.text
        assert grpc_status(ports.grpc, sent) != grpc.StatusCode.OK
        assert grpc_status(ports.grpc, {f"triton-grpc-protocol-{k}": v for k, v in sent.items()}) != grpc.StatusCode.OK
    wrong = TextClient(f"127.0.0.1:{ports.grpc}", "grpc", api_key="wrong", retry=RetryPolicy(attempts=1))
    with wrong as client, pytest.raises(ClientError):
        client.embed(["a"])


def test_with_the_key_every_client_passes(keyed, settings, monkeypatch):
    ports, good = keyed.ports, {"authorization": f"Bearer {KEY}"}
    assert grpc_status(ports.grpc, headers(KEY, "grpc")) == grpc.StatusCode.OK
    for protocol, port in (("grpc", ports.grpc), ("http", ports.http)):
        with TextClient(f"127.0.0.1:{port}", protocol, api_key=KEY) as client:
            assert client.embed(["a key opens every door"]).shape == (1, 384)
    monkeypatch.setenv(API_KEY_ENV, KEY)  # read from the environment when not passed
    with TextClient(f"127.0.0.1:{ports.grpc}", "grpc") as client:
        assert client.embed(["from the environment"]).shape == (1, 384)
    api = httpx.post(f"http://127.0.0.1:{ports.api}/v1/embeddings", json={"input": "a"}, headers=good)
    assert api.status_code == 200 and len(api.json()["data"]) == 1
    healthcheck = [sys.executable, str(ROOT / "docker" / "healthcheck.py"), "--url", f"http://127.0.0.1:{ports.http}"]
    assert subprocess.run(healthcheck, capture_output=True, timeout=60).returncode == 0
    monkeypatch.delenv(API_KEY_ENV)
    refused = subprocess.run(healthcheck, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "401" in refused.stderr


def test_health_readiness_and_metrics_stay_open(keyed):
    ports = keyed.ports
    assert keyed.ready()[0] == 200
    for url in (
        f"http://127.0.0.1:{ports.http}/v2/health/ready",
        f"http://127.0.0.1:{ports.metrics}/metrics",
        f"http://127.0.0.1:{ports.api}/health",
        f"http://127.0.0.1:{ports.health}/live",
        f"http://127.0.0.1:{ports.http}/v2/models/ensemble",  # metadata: what a client reads before it infers
    ):
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, url
