"""The defaults as they are (engine.kind and engine.precision "auto"): what the stage chose on this machine is what
common/engine_choice.py says, Triton's log and the API front's /info say it, and the served embeddings hold the
bound every default precision is held to (cosine >= 0.9999 to sentence-transformers)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from client import TextClient
from common.engine_choice import choose_engine
from model_repository.generate import generate
from serving.launcher.harness import local_server
from settings import load_settings
from tests.server.api_front_process import Front, urls


@pytest.fixture(scope="module")
def default_server(exported, tmp_path_factory):
    defaults = load_settings()
    assert (defaults.engine.kind, defaults.engine.precision) == ("auto", "auto")
    repository = generate(defaults, exported, tmp_path_factory.mktemp("auto_repo") / "repository")
    server = local_server(defaults, repository, tmp_path_factory.mktemp("auto_server")).start()
    yield server, repository
    server.stop()


def test_the_default_engine_is_this_machine_s_choice_and_says_so(default_server, sentences, reference_model):
    server, repository = default_server
    choice = choose_engine("auto", "auto", False, "embedding")
    assert f"ensemble_0_0: {choice.describe()}" in server.log_path.read_text()
    with TextClient(server.grpc_url, "grpc") as client:
        served = client.embed(sentences)
    expected = reference_model.encode(sentences, convert_to_numpy=True)
    cosine = (served * expected).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.9999, (choice, cosine.min())
    front = Front(repository, urls(server))
    try:
        info = httpx.get(front.url + "/info").json()
    finally:
        front.stop()
    assert (info["engine"], info["model_dtype"]) == (choice.kind, choice.precision)
