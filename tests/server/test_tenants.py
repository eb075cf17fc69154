"""Tenants on every port (serving/tenants.py), on the real launcher with a keys file and two API workers: a
wrong key is 401 on the API and HTTP fronts and UNAUTHENTICATED on gRPC; a tenant over its rate gets 429 (or
RESOURCE_EXHAUSTED) with a Retry-After while another tenant is untouched; the rate holds across workers within
10 %; a tenant capped at ingestion may not call a query lane; a stream passes the gRPC front for a tenant and
ends for a wrong key; a changed keys file takes effect without a restart."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2

from protocol.kserve_grpc import MODEL_INFER, model_infer_request
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from serving.tenant_limits import shm_path

RELOAD_S = 0.5
KEYS = """
[[tenant]]
name = "free"
keys = ["free-1"]

[[tenant]]
name = "limited"
keys = ["limited-1"]
requests_per_s = 4

[[tenant]]
name = "metered"
keys = ["metered-1"]
requests_per_s = 10

[[tenant]]
name = "ingest"
keys = ["ingest-1"]
max_priority = "ingestion"
"""
TEXT_BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]}


@pytest.fixture(scope="module")
def served(settings, repository, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tenants")
    keys = folder / "keys.toml"
    keys.write_text(KEYS)
    overrides = [f'tenants.keys_file="{keys}"', f"tenants.reload_s={RELOAD_S}", "api.workers=2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("BERT_TRITON_API_KEY", raising=False)
        started = Launcher(settings.path, repository, Ports.free(), folder / "log", overrides).start()
    yield started, keys
    started.kill()
    shm_path(started.ports.grpc).unlink(missing_ok=True)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def api(ports: Ports, key: str) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{ports.api}/v1/embeddings", json={"input": "a"}, headers=bearer(key), timeout=60
    )


def kserve(ports: Ports, key: str, body: dict = TEXT_BODY, model: str = "ensemble") -> httpx.Response:
    url = f"http://127.0.0.1:{ports.http}/v2/models/{model}/infer"
    return httpx.post(url, json=body, headers=bearer(key), timeout=60)


def grpc_call(ports: Ports, metadata: dict, message: bytes | None = None) -> grpc.RpcError | None:
    with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        call = channel.unary_unary(MODEL_INFER, response_deserializer=lambda data: data)
        try:
            call(message or model_infer_request("ensemble", ["hello"]), timeout=30, metadata=tuple(metadata.items()))
        except grpc.RpcError as exc:
            return exc
    return None


def test_a_wrong_key_is_refused_on_every_port_and_a_right_one_passes(served):
    ports = served[0].ports
    for key in ("wrong", "free-1x"):
        assert api(ports, key).status_code == 401
        http = kserve(ports, key)
        assert http.status_code == 401 and "API key" in http.json()["error"]
        assert grpc_call(ports, bearer(key)).code() == grpc.StatusCode.UNAUTHENTICATED
    assert api(ports, "free-1").status_code == 200
    assert kserve(ports, "free-1").status_code == 200
    assert grpc_call(ports, bearer("free-1")) is None
    assert grpc_call(ports, {"triton-grpc-protocol-authorization": "Bearer free-1"}) is None  # Triton's name
    with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:  # the rest of KServe passes, keyless
        ready = channel.unary_unary("/inference.GRPCInferenceService/ServerReady", response_deserializer=lambda d: d)
        assert service_pb2.ServerReadyResponse.FromString(ready(b"", timeout=10)).ready


def test_a_tenant_over_its_rate_waits_and_the_others_do_not(served):
    ports = served[0].ports
    with ThreadPoolExecutor(8) as pool:  # both tenants at once
        answers = list(pool.map(lambda key: (key, api(ports, key)), ["limited-1", "free-1"] * 16))
    limited = [answer for key, answer in answers if key == "limited-1"]
    free = [answer for key, answer in answers if key == "free-1"]
    refused = [r for r in limited if r.status_code == 429]
    assert refused and all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert (
        refused[0].json()["error"]["type"] == "rate_limit_error" and "limited" in refused[0].json()["error"]["message"]
    )
    assert [r.status_code for r in free] == [200] * 16
    time.sleep(1.0)
    statuses = [kserve(ports, "limited-1").status_code for _ in range(8)]
    assert 429 in statuses and statuses[0] == 200
    # gRPC shares the bucket; calls in a row, so that the HTTP calls' pace (slow on a cold server) cannot refill it
    answers = [grpc_call(ports, bearer("limited-1")) for _ in range(8)]
    over = next((answer for answer in answers if answer is not None), None)
    assert over is not None and over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, answers
    assert int(dict(over.trailing_metadata())["retry-after"]) >= 1
    metrics = httpx.get(f"http://127.0.0.1:{ports.api}/metrics", timeout=30).text
    assert 'bert_tenant_requests_total{tenant="free",front="api"}' in metrics
    assert 'bert_tenant_rejections_total{tenant="limited",front="api",code="429"}' in metrics
    assert 'bert_tenant_rejections_total{tenant="",front="grpc",code="401"}' in metrics


def test_the_rate_holds_across_the_api_workers(served):
    """Several times its rate from several connections for a few seconds: what passes is its rate, plus the
    bucket's first second, within 10 %."""
    ports, seconds, rate = served[0].ports, 4.0, 10
    end = time.monotonic() + seconds

    def send(_) -> int:
        passed = 0
        with httpx.Client(timeout=60) as client:  # a connection each: the kernel spreads them over the workers
            while time.monotonic() < end:
                url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
                answer = client.post(url, json={"input": "a"}, headers=bearer("metered-1"))
                passed += answer.status_code == 200
                time.sleep(0.03)  # several times the rate from 3 connections, leaving the CPU to the server
        return passed

    with ThreadPoolExecutor(3) as pool:
        passed = sum(pool.map(send, range(3)))
    assert passed == pytest.approx(rate * seconds + rate, rel=0.1)


def test_a_tenant_capped_at_ingestion_may_not_call_a_query_lane(served):
    ports = served[0].ports
    refused = kserve(ports, "ingest-1", model="ensemble-query")
    assert refused.status_code == 403 and "not its query lane 'ensemble-query'" in refused.json()["error"]
    assert kserve(ports, "ingest-1").status_code == 200
    assert kserve(ports, "free-1", model="ensemble-query").status_code == 200
    denied = grpc_call(ports, bearer("ingest-1"), model_infer_request("ensemble-query", ["hello"]))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    assert grpc_call(ports, bearer("ingest-1")) is None


def stream(ports: Ports, key: str, model: str = "ensemble") -> tuple[int, list[str]]:
    """Two texts over one ModelStreamInfer stream through the gRPC front: (answers, errors)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    answers, errors = [], []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"streamed"]], dtype=object))
    client.start_stream(
        lambda result, error: errors.append(str(error)) if error else answers.append(result),
        headers=bearer(key),
    )
    for _ in range(2):
        try:
            client.async_stream_infer(model, [text])
        except InferenceServerException:  # the stream already ended: its reason comes through the callback
            break
    deadline = time.monotonic() + 30
    while len(answers) + len(errors) < 2 and not (errors and not answers) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = len(answers), list(errors)  # before the stream is closed, which may add a CANCELLED of its own
    client.stop_stream(cancel_requests=True)
    client.close()
    return seen


def test_the_grpc_front_passes_a_stream_for_a_tenant_and_ends_it_for_a_wrong_key(served):
    ports = served[0].ports
    assert stream(ports, "free-1") == (2, [])
    answered, errors = stream(ports, "wrong")
    assert answered == 0 and errors and "UNAUTHENTICATED" in errors[0], errors


def test_a_changed_keys_file_takes_effect_without_a_restart(served):
    launcher, keys = served
    ports = launcher.ports
    keys.write_text(KEYS.replace('["free-1"]', '["free-2"]'))
    time.sleep(RELOAD_S)  # each process checks the file on its own, at most every reload_s

    def every_front_takes_the_new_key() -> bool:
        return (
            api(ports, "free-2").status_code == 200
            and kserve(ports, "free-2").status_code == 200
            and grpc_call(ports, bearer("free-2")) is None
        )

    deadline = time.monotonic() + 20  # a loaded machine may take a front's processes a while to reach the check
    while not every_front_takes_the_new_key() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert every_front_takes_the_new_key()
    assert api(ports, "free-1").status_code == 401 and kserve(ports, "free-1").status_code == 401
    keys.write_text("[[tenant]]\nname = 'broken'\n")  # not taken: the last good file stays
    time.sleep(RELOAD_S + 0.5)
    # Each process keeps the last file it took. An API worker that served no request while the second file was
    # there never read it (the file is checked on a request), so the key asked for is in both good files.
    for _ in range(6):  # fresh connections: both API workers are asked
        assert api(ports, "ingest-1").status_code == 200
    assert kserve(ports, "ingest-1").status_code == 200 and grpc_call(ports, bearer("ingest-1")) is None
    assert launcher.process.poll() is None
