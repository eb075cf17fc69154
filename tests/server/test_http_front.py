"""The HTTP front (serving/http_front/proxy.py) in front of the real tritonserver, started by the real launcher.

No body reaches tritonserver's parser in a shape that kills it: oversized ones get 413 whatever their
content type or model, a form-typed body over 4 MiB (SIGSEGV in Triton 2.51 when sent to it directly) is
answered, malformed JSON gets 400, and after each the next good request succeeds on the same tritonserver. The
request id it echoes reaches Triton, which answers it as the response's "id"."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import signal
import struct
import time

import numpy as np
import pytest

from client.core import TextClient
from serving.launcher import harness
from serving.launcher.procfs import child_processes
from serving.launcher.triton_command import Ports
from settings import load_settings

LIMIT = load_settings().front.max_body_bytes
CONTENT_TYPES = [None, "application/x-www-form-urlencoded", "application/json", "application/octet-stream"]


@pytest.fixture(scope="module")
def launcher(settings, repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("front") / "launcher.log"
    started = harness.Launcher(settings.path, repository, Ports.free(), log).start()
    yield started
    started.kill()


def post(launcher, path: str, body, headers: dict | None = None, chunked: bool = False) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", launcher.ports.http, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers or {}, encode_chunked=chunked)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, json.loads(data) if data else {}


def infer_body(texts: list[str]) -> bytes:
    tensor = {"name": "text", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
    return json.dumps({"inputs": [tensor]}).encode()


def assert_serving(launcher, triton_pid: int) -> None:
    status, body = post(launcher, "/v2/models/ensemble/infer", infer_body(["still serving"]))
    assert status == 200 and body["outputs"][0]["shape"] == [1, 384], body
    assert launcher.triton_pid == triton_pid, "the same tritonserver: nothing crashed"


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("model", ["ensemble", "no_such_model"])
def test_a_body_over_the_limit_is_refused_before_tritonserver(launcher, content_type, model):
    triton = launcher.triton_pid
    headers = {"Content-Type": content_type} if content_type else {}
    status, body = post(launcher, f"/v2/models/{model}/infer", b"x" * (LIMIT + 1), headers)
    assert status == 413 and "front.max_body_bytes" in body["error"], body
    assert_serving(launcher, triton)


def test_a_chunked_body_over_the_limit_is_refused(launcher):
    triton = launcher.triton_pid
    chunks = (b"y" * (1 << 20) for _ in range(LIMIT // (1 << 20) + 1))
    status, body = post(launcher, "/v2/models/ensemble/infer", chunks, chunked=True)
    assert status == 413, body
    assert_serving(launcher, triton)


@pytest.mark.parametrize("model", ["ensemble", "no_such_model"])
def test_a_form_typed_body_over_4_mib_is_answered(launcher, model):
    """What `curl -d @file` sends; tritonserver 2.51 alone dies with SIGSEGV on it (upstream issue 5840)."""
    triton = launcher.triton_pid
    body = infer_body(["a " * 2_600_000])  # 5.2 MB, within the front's limit
    status, answer = post(
        launcher, f"/v2/models/{model}/infer", body, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == (400 if model == "ensemble" else 404), answer  # the text is over tokenizer.max_text_bytes
    assert_serving(launcher, triton)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", "the body is not JSON"),
        (b"{}", "non-empty list 'inputs'"),
        (
            json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [7]}]}).encode(),
            "not of datatype BYTES",
        ),
    ],
)
def test_malformed_json_is_a_client_error(launcher, body, expected):
    status, answer = post(launcher, "/v2/models/ensemble/infer", body, {"Content-Type": "application/json"})
    assert status == 400 and expected in answer["error"] and "tritonserver said" in answer["error"], answer


def test_multipart_is_unsupported_media(launcher):
    status, answer = post(
        launcher, "/v2/models/ensemble/infer", b"--b\r\n\r\n--b--", {"Content-Type": "multipart/form-data; boundary=b"}
    )
    assert status == 415, answer


def test_gzip_bodies_are_inflated_within_the_limit(launcher):
    body = infer_body(["a compressed request"])
    status, answer = post(launcher, "/v2/models/ensemble/infer", gzip.compress(body), {"Content-Encoding": "gzip"})
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384], answer
    bomb = gzip.compress(b" " * (LIMIT + 1))  # ~16 KB on the wire
    status, answer = post(launcher, "/v2/models/ensemble/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413, answer
    status, answer = post(launcher, "/v2/models/ensemble/infer", body, {"Content-Encoding": "compress"})
    assert status == 415, answer


def test_responses_are_compressed_only_when_the_client_asks(launcher):
    """curl without --compressed sends no Accept-Encoding: it gets plain JSON, whatever the front's HTTP client
    would have asked Triton for."""
    for accept, encoding in ((None, None), ("deflate", "deflate")):
        connection = http.client.HTTPConnection("127.0.0.1", launcher.ports.http, timeout=60)
        body = infer_body(["plain"])
        connection.putrequest("POST", "/v2/models/ensemble/infer", skip_accept_encoding=True)  # as curl does
        if accept:
            connection.putheader("Accept-Encoding", accept)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        body = response.read()
        connection.close()
        assert response.status == 200 and response.getheader("Content-Encoding") == encoding
        if encoding is None:
            assert json.loads(body)["outputs"][0]["shape"] == [1, 384]


def test_http_client_through_the_front_matches_grpc(launcher, sentences):
    """tritonclient's HTTP (binary tensor data) passes the front unchanged."""
    with (
        TextClient(f"http://127.0.0.1:{launcher.ports.http}") as http,
        TextClient(f"127.0.0.1:{launcher.ports.grpc}") as grpc,
    ):
        np.testing.assert_array_equal(http.embed(sentences[:8]), grpc.embed(sentences[:8]))


def test_a_dead_front_worker_is_started_again(launcher):
    (worker,) = [pid for pid, _, argv in child_processes(launcher.process.pid) if b"serving.http_front" in argv]
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while 'bert_launcher_front_restarts_total{front="http"} 1' not in launcher.metrics():
        assert time.monotonic() < deadline, launcher.metrics()
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert_serving(launcher, launcher.triton_pid)
            break
        except (ConnectionError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.parametrize(
    ("sent", "echoed"), [("trace-me.42", "trace-me.42"), (None, None), ("x" * 129, None), ("not plain!", None)]
)
def test_the_front_echoes_a_plain_request_id_and_makes_one_otherwise(launcher, sent, echoed):
    connection = http.client.HTTPConnection("127.0.0.1", launcher.ports.http, timeout=60)
    try:
        connection.request(
            "POST", "/v2/models/ensemble/infer", infer_body(["id?"]), {"X-Request-Id": sent} if sent else {}
        )
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    assert response.status == 200
    given = response.getheader("X-Request-Id")
    assert given == echoed if echoed else re.fullmatch(r"[0-9a-f]{32}", given), given


@pytest.mark.parametrize(
    ("path", "own_id", "binary"),
    [
        ("/v2/models/ensemble/infer", None, False),
        ("/v2/models/ensemble/infer", "the-callers-own", False),
        ("/v2/models/ensemble/versions/1/infer", None, True),  # tritonclient's binary-data extension
    ],
)
def test_triton_answers_with_the_request_id_unless_the_body_has_its_own(launcher, path, own_id, binary):
    request = json.loads(infer_body(["whose request?"]))
    request.update({"id": own_id} if own_id else {})
    headers = {"X-Request-Id": "follow-me.7"}
    if binary:
        text = b"whose request?"
        data = struct.pack("<I", len(text)) + text  # a BYTES element: its length, then its bytes
        tensor = request["inputs"][0]
        del tensor["data"]
        tensor["parameters"] = {"binary_data_size": len(data)}
        body = json.dumps(request).encode()
        headers["Inference-Header-Content-Length"] = str(len(body))
        body += data
    else:
        body = json.dumps(request).encode()
    status, answer = post(launcher, path, body, headers)
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384], answer
    assert answer["id"] == (own_id or "follow-me.7")


def test_the_front_answers_503_while_tritonserver_restarts(launcher):
    os.kill(launcher.triton_pid, signal.SIGKILL)
    time.sleep(0.3)
    headers = {"X-Request-Id": "restart-probe-1"}
    status, answer = post(launcher, "/v2/models/ensemble/infer", infer_body(["anyone there?"]), headers)
    assert status == 503 and "starting it again" in answer["error"], answer
    assert "front: request restart-probe-1 POST '/v2/models/ensemble/infer': 503" in launcher.log_path.read_text()
    deadline = time.monotonic() + 30
    while launcher.ready()[0] != 200:
        assert time.monotonic() < deadline, launcher.ready()
        time.sleep(0.2)
    assert_serving(launcher, launcher.triton_pid)


def test_the_http_client_rides_out_a_tritonserver_restart(launcher):
    """Through the front the client sees 503 while tritonserver is down, and retries it until the restart."""
    os.kill(launcher.triton_pid, signal.SIGKILL)
    time.sleep(0.3)
    assert launcher.ready()[0] == 503
    started = time.monotonic()
    with TextClient(f"http://127.0.0.1:{launcher.ports.http}", timeout_s=60) as client:
        assert client.embed(["after a crash"]).shape == (1, 384)
    assert time.monotonic() - started > 0.5, "answered only once tritonserver was back (1 s backoff at least)"
