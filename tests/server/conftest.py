"""The real tritonservers the server suites share: one per topology for the session, on free ports (through
serving/launcher/harness.py, as the benchmarks start theirs), and an API front over the first for a module."""

from __future__ import annotations

import dataclasses

import pytest

from serving.launcher.harness import local_server
from tests.server.api_front_process import Front, urls


@pytest.fixture(scope="session")
def server(settings, repository, tmp_path_factory):
    triton = local_server(settings, repository, tmp_path_factory.mktemp("server")).start()
    yield triton
    triton.stop()


@pytest.fixture(scope="session")
def two_stage_server(settings, exported, tmp_path_factory):
    """The same model in the two-stage topology (tokenizer -> encoder), beside the default one-stage server."""
    from model_repository.generate import generate

    two_stage = dataclasses.replace(settings, ensemble=dataclasses.replace(settings.ensemble, topology="two_stage"))
    root = generate(two_stage, exported, tmp_path_factory.mktemp("repo_two_stage") / "repository")
    triton = local_server(two_stage, root, tmp_path_factory.mktemp("server_two_stage")).start()
    yield triton
    triton.stop()


@pytest.fixture(params=["one_stage", "two_stage"])
def topology_server(request):
    """Each topology's server in turn: what clients see must not depend on it."""
    return request.getfixturevalue("server" if request.param == "one_stage" else "two_stage_server")


@pytest.fixture(scope="module")
def front(server, repository):
    """The API front (its settings' defaults) over the session's one-stage server."""
    started = Front(repository, urls(server))
    yield started
    started.stop()
