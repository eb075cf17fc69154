"""The streaming model (<model>-stream, stages/stream_model.py) on the real launcher (CPU): a gRPC stream answers as
the unary model does, a bad text or a spent budget fails its own request and the stream serves on, the API front
calls the streaming model and, when its stub is killed, the unary one, and SIGTERM answers what the stream holds."""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from common.contract import BUDGET_PARAMETER, STREAM_SUFFIX
from loadtest.corpus import load_text
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports

STREAM = f"ensemble{STREAM_SUFFIX}"
OVERRIDES = ['engine.precision="fp32"', "stream.enabled=true", "server.canary_interval_s=0", "api.workers=1"]


def started(settings, exported, tmp_path_factory) -> Launcher:
    from settings import load_settings

    work = tmp_path_factory.mktemp("streaming")
    repository = generate(load_settings(None, OVERRIDES), exported, work / "repository")
    return Launcher(settings.path, repository, Ports.free(), work / "launcher.log", OVERRIDES).start()


@pytest.fixture(scope="module")
def launcher(settings, exported, tmp_path_factory):
    launcher = started(settings, exported, tmp_path_factory)
    yield launcher
    launcher.terminate()
    launcher.process.wait(timeout=90)


@pytest.fixture
def own_launcher(settings, exported, tmp_path_factory):
    """A launcher for one test that leaves it changed (a killed stub); the test stops it."""
    launcher = started(settings, exported, tmp_path_factory)
    yield launcher
    if launcher.process.poll() is None:
        launcher.terminate()
        launcher.process.wait(timeout=90)


def text_input(texts: list) -> grpcclient.InferInput:
    rows = np.array([[text if isinstance(text, bytes) else text.encode()] for text in texts], dtype=np.object_)
    tensor = grpcclient.InferInput("text", list(rows.shape), "BYTES")
    tensor.set_data_from_numpy(rows)
    return tensor


class Stream:
    """One gRPC stream to the streaming model: requests sent by id, answers (result or error) collected by id."""

    def __init__(self, launcher: Launcher) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{launcher.ports.grpc}")
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))
        self.pending: list[str] = []

    def send(self, request_id: str, texts: list, parameters: dict | None = None) -> None:
        self.client.async_stream_infer(STREAM, [text_input(texts)], request_id=request_id, parameters=parameters)
        self.pending.append(request_id)

    def collect(self, timeout_s: float = 60) -> tuple[dict, list[str]]:
        """The embeddings by request id, and the errors' messages (a stream's error names no request)."""
        results, errors = {}, []
        for _ in self.pending:
            result, error = self.answers.get(timeout=timeout_s)
            if error is not None:
                errors.append(error.message())
            else:
                results[result.get_response().id] = result.as_numpy("embedding")
        self.pending = []
        return results, errors

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def executions(launcher: Launcher, more_than: dict[str, int] | None = None) -> dict[str, int]:
    """Requests each Triton model has answered; with more_than, waited for (up to 5 s) until the streaming model's
    count is past it: Triton counts a decoupled request once it is released, just after its answer is sent."""
    deadline = time.monotonic() + 5
    while True:
        stats = requests.get(f"http://127.0.0.1:{launcher.ports.http}/v2/models/stats", timeout=10).json()
        counts = {model["name"]: model["inference_stats"]["success"]["count"] for model in stats["model_stats"]}
        if more_than is None or counts[STREAM] > more_than[STREAM] or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def unary(launcher: Launcher, texts: list[str]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{launcher.ports.grpc}")
    return client.infer("ensemble", [text_input(texts)]).as_numpy("embedding")


def test_a_stream_answers_as_the_unary_model_does(launcher):
    texts = load_text()[:12]
    stream = Stream(launcher)
    try:
        for index in range(8):  # in flight together: the stage merges them into its batches
            stream.send(f"r{index}", texts[index : index + 1 + index % 3])
        results, errors = stream.collect()
    finally:
        stream.close()
    assert not errors and sorted(results) == [f"r{index}" for index in range(8)]
    for index in range(8):
        expected = unary(launcher, texts[index : index + 1 + index % 3])
        np.testing.assert_allclose(results[f"r{index}"], expected, atol=2e-6, rtol=0)


def test_a_bad_text_or_a_spent_budget_fails_alone_and_the_stream_serves_on(launcher):
    stream = Stream(launcher)
    try:
        stream.send("good", ["A text before."])
        stream.send("bad", [b"\xff\xfe"])
        stream.send("late", ["A text whose budget is one microsecond."], {BUDGET_PARAMETER: 1})
        stream.send("after", ["A text after."])
        results, errors = stream.collect()
    finally:
        stream.close()
    assert sorted(results) == ["after", "good"]
    assert len(errors) == 2 and any("UTF-8" in e for e in errors), errors
    assert any("time budget ran out" in e for e in errors), errors


def test_the_api_front_calls_the_streaming_model(launcher):
    body = {"model": "all-MiniLM-L6-v2", "input": ["Triton batches requests.", "Second text"]}
    expected = unary(launcher, body["input"])
    before = executions(launcher)
    answer = requests.post(f"http://127.0.0.1:{launcher.ports.api}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    after = executions(launcher, before)
    vectors = np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected, atol=2e-6, rtol=0)
    assert after[STREAM] > before[STREAM]
    assert after["ensemble"] == before["ensemble"] and after["ensemble-query"] == before["ensemble-query"]


def restarted(launcher: Launcher, model: str) -> bool:
    status, body = launcher.ready()
    return status == 200 and any(restart["model"] == model for restart in body.get("stub_restarts", []))


def watchdog_report(launcher: Launcher) -> str:
    """What to read when a restart did not come: the launcher's /ready, the stubs alive, what the watchdog and
    tritonserver logged about loading."""
    words = ("watchdog", "loading", "loaded", "unloaded", "failed", "error", "Stub")
    lines = [line for line in launcher.log_path.read_text().splitlines() if any(word in line for word in words)]
    return f"/ready {launcher.ready()}; stubs {launcher.stub_pids(STREAM)}; log:\n" + "\n".join(lines[-40:])


def test_a_killed_stream_stub_fails_over_to_the_unary_model_and_comes_back(own_launcher):
    """The front's requests the dead stub held are sent again on the unary model (none is lost); the watchdog
    restarts the stub, and the front's next stream finds it."""
    launcher = own_launcher
    url = f"http://127.0.0.1:{launcher.ports.api}/v1/embeddings"
    body = {"model": "all-MiniLM-L6-v2", "input": [f"Text {index} of a burst." for index in range(40)]}
    (stub,) = launcher.stub_pids(STREAM)
    session = requests.Session()
    os.kill(stub, signal.SIGKILL)
    answers = [session.post(url, json=body, timeout=60) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200] * 3, [answer.text for answer in answers]
    metrics = requests.get(f"http://127.0.0.1:{launcher.ports.api}/metrics", timeout=10).text
    assert 'outcome="retried"' in metrics
    deadline = time.monotonic() + 120
    while not restarted(launcher, STREAM):  # by the launcher's own account, then by the stubs alive
        assert time.monotonic() < deadline, f"the watchdog did not restart the stream stub: {watchdog_report(launcher)}"
        time.sleep(0.5)
    assert launcher.stub_pids(STREAM) not in ([], [stub]), watchdog_report(launcher)
    before, served = executions(launcher), None
    while time.monotonic() < deadline:
        served = session.post(url, json=body, timeout=60)
        if served.status_code == 200 and executions(launcher, before)[STREAM] > before[STREAM]:
            break
    assert served is not None and served.status_code == 200
    assert executions(launcher, before)[STREAM] > before[STREAM], "the front streams again"
    # Tritonserver 2.51 never unloads the dead stub's version (the requests sent to it hold it): once every stub has
    # exited, the drain stops it rather than waiting out its exit timeout (16 s), and the stop is a clean one.
    stopping = time.monotonic()
    launcher.terminate()
    assert launcher.process.wait(timeout=90) == 0, watchdog_report(launcher)
    assert time.monotonic() - stopping < 15, watchdog_report(launcher)


def test_calls_a_killed_stream_stub_held_are_retried_at_once(own_launcher):
    """Tritonserver 2.51 neither answers nor fails what a stream stub held when it died: the API front's and
    TextClient(stream=True)'s next call that finds the dead stub fails every call sent before it, and each is sent
    again, long before api.timeout_s (60 s) or the client's deadline."""
    from client import TextClient

    launcher = own_launcher
    url = f"http://127.0.0.1:{launcher.ports.api}/v1/embeddings"
    heavy = [" ".join(["held"] * 250)] * 32
    (stub,) = launcher.stub_pids(STREAM)
    before = executions(launcher)

    def timed(call, *args) -> tuple[object, float]:
        started = time.monotonic()
        return call(*args), time.monotonic() - started

    def post(texts: list[str]) -> int:
        return requests.post(url, json={"model": "all-MiniLM-L6-v2", "input": texts}, timeout=120).status_code

    client = TextClient(f"127.0.0.1:{launcher.ports.grpc}", stream=True, timeout_s=120)
    with client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        held = [pool.submit(timed, post, heavy) for _ in range(4)]
        held += [pool.submit(timed, client.embed, heavy) for _ in range(2)]
        time.sleep(1.0)  # the stub has taken them: the first batch is running, the rest wait in its queue
        os.kill(stub, signal.SIGKILL)
        time.sleep(0.5)
        assert post(["A text that finds the dead stub."]) == 200
        assert client.embed(["A text that finds it too."]).shape == (1, 384)
        answers = [future.result() for future in held]
    assert executions(launcher)[STREAM] - before[STREAM] < 6, "the stub answered them all before it died"
    assert [answer for answer, _ in answers[:4]] == [200] * 4, answers
    assert all(vectors.shape == (32, 384) for vectors, _ in answers[4:])
    assert max(seconds for _, seconds in answers) < 30, [seconds for _, seconds in answers]


def test_the_client_library_streams(launcher):
    """TextClient(stream=True): concurrent calls on one stream, each its own answer; a bad text is its own ClientError;
    `python -m client --stream` prints the same vectors."""
    from concurrent.futures import ThreadPoolExecutor

    from client import ClientError, TextClient

    texts = load_text()[:16]
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", stream=True) as client:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: client.embed(texts[i : i + 2]), range(0, 16, 2)))
        with pytest.raises(ClientError, match="max_text_bytes"):  # the stage's refusal, from the stream
            client.embed(["x" * ((1 << 20) + 1)])
        np.testing.assert_allclose(client.embed(texts[:1]), unary(launcher, texts[:1]), atol=2e-6, rtol=0)
    for index, vectors in zip(range(0, 16, 2), got, strict=True):
        np.testing.assert_allclose(vectors, unary(launcher, texts[index : index + 2]), atol=2e-6, rtol=0)
    command = [sys.executable, "-m", "client", "embed", "--stream", "--url", f"127.0.0.1:{launcher.ports.grpc}"]
    run = subprocess.run([*command, texts[0]], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_locust_streams_to_the_streaming_model_and_is_accepted(launcher, tmp_path):
    """`python -m loadtest --protocol grpc-stream`: each user's requests on a stream of its own, to <model>-stream."""
    command = [sys.executable, "-m", "loadtest", "--url", f"127.0.0.1:{launcher.ports.grpc}", "--users", "2"]
    command += ["--protocol", "grpc-stream", "--duration", "6s", "--results", str(tmp_path), "--batch-mix", "1:3,4:1"]
    command += ["--p50-ms", "1000", "--p99-ms", "2000", "--min-rps", "5", "--max-fail-ratio", "0"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "ACCEPTED" in run.stdout, run.stdout + run.stderr
    result = json.loads((tmp_path / "loadtest.json").read_text())
    assert result["total"]["requests"] > 20 and result["total"]["failures"] == 0, result["total"]
    assert result["server_stages"][STREAM]["requests"] >= result["total"]["requests"]


def test_sigterm_answers_what_the_stream_holds(launcher):
    """Last in this module: the launcher drains. Every request sent before SIGTERM is answered, and it exits 0."""
    stream = Stream(launcher)
    texts = load_text()
    for index in range(24):
        stream.send(f"d{index}", texts[index * 4 : index * 4 + 4])
    launcher.process.send_signal(signal.SIGTERM)
    results, errors = stream.collect(timeout_s=90)
    stream.close()
    assert not errors and len(results) == 24
    assert launcher.process.wait(timeout=90) == 0
