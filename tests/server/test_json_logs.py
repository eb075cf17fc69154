"""server.log_format = "json" (serving/log.py) on the real launcher: each line of the launcher and its fronts is
one JSON object (time, level, component, message), a line about a request carries its request_id, and
tritonserver's own lines carry ISO 8601 times."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time

import pytest

from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports


@pytest.fixture()
def json_launcher(settings, repository, tmp_path):
    text, count = re.subn(r'^log_format = "text"', 'log_format = "json"', settings.path.read_text(), flags=re.M)
    assert count == 1
    path = tmp_path / "settings.toml"
    path.write_text(text)
    started = Launcher(path, repository, Ports.free(), tmp_path / "launcher.log").start()
    yield started
    started.kill()


def test_every_line_of_ours_is_a_json_object_and_a_request_line_has_its_id(json_launcher):
    os.kill(json_launcher.triton_pid, signal.SIGKILL)  # the HTTP front then answers 503 and logs it
    time.sleep(0.3)
    connection = http.client.HTTPConnection("127.0.0.1", json_launcher.ports.http, timeout=30)
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]})
    connection.request("POST", "/v2/models/ensemble/infer", body, {"X-Request-Id": "json-line-7"})
    assert connection.getresponse().status == 503
    connection.close()
    deadline = time.monotonic() + 30
    while json_launcher.ready()[0] != 200:  # the launcher starts tritonserver again, and says so
        assert time.monotonic() < deadline
        time.sleep(0.2)
    lines = json_launcher.log_path.read_text().splitlines()
    ours = [json.loads(line) for line in lines if line.startswith("{")]
    assert not [line for line in lines if line.startswith(("launcher: ", "front: ", "api: "))], "no text lines"
    for line in ours:
        assert set(line) >= {"time", "level", "component", "message"}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["time"]), line
    components = {line["component"] for line in ours}
    assert {"launcher", "front"} <= components, components
    (refused,) = [line for line in ours if line.get("request_id") == "json-line-7"]
    assert refused["component"] == "front" and refused["level"] == "error" and "503" in refused["message"]
    assert any(line["message"].startswith("tritonserver ready") for line in ours)
    assert any(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", line) for line in lines), "tritonserver's ISO 8601 lines"
