"""`python -m serving.launcher --set SECTION.KEY=VALUE` reaches every process that reads the settings: the API
front's workers read the settings files again, so the launcher hands them its overrides too."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports

BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def launcher(settings, repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("overrides") / "launcher.log"
    started = Launcher(
        settings.path, repository, Ports.free(), log, overrides=[f"api.max_body_bytes={BODY_LIMIT}"]
    ).start()
    yield started
    started.terminate()
    started.process.wait(timeout=60)


def post(port: int, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_api_front_applies_the_launchers_overrides(launcher, settings):
    small = json.dumps({"input": "Triton batches requests.", "model": settings.model.name}).encode()
    status, answer = post(launcher.ports.api, small)
    assert status == 200 and len(answer["data"]) == 1
    large = json.dumps({"input": "word " * BODY_LIMIT, "model": settings.model.name}).encode()
    status, answer = post(launcher.ports.api, large)
    assert status == 413, answer
    assert f"api.max_body_bytes is {BODY_LIMIT}" in answer["error"]["message"]
