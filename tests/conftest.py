"""Shared fixtures: one export, one generated repository and one real tritonserver per test session.

The export, the repository and the server are imported inside their fixtures: the GPU tests (make test-gpu)
run where neither tritonclient nor the Triton wheel is installed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from settings import load_settings

if TYPE_CHECKING:
    from serving.launcher.tritonserver import TritonServer


@pytest.fixture(scope="session")
def settings():
    return load_settings()


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    from export.onnx_export import VALIDATION_SENTENCES

    return VALIDATION_SENTENCES.read_text().splitlines()


@pytest.fixture(scope="session")
def exported(settings, tmp_path_factory) -> Path:
    from export.__main__ import export

    out = tmp_path_factory.mktemp("export")
    engine = settings.engine
    export(
        settings.model.source,
        settings.model.task,
        settings.model.max_tokens,
        out,
        engine.onnx_opset,
        engine.onnx_tolerance,
    )
    return out


@pytest.fixture(scope="session")
def repository(settings, exported, tmp_path_factory) -> Path:
    from model_repository.generate import generate

    return generate(settings, exported, tmp_path_factory.mktemp("repo") / "repository")


def start_server(settings, repository: Path, log_dir: Path) -> TritonServer:
    from serving.launcher.harness import local_server

    return local_server(settings, repository, log_dir).start()


@pytest.fixture(scope="session")
def server(settings, repository, tmp_path_factory):
    triton = start_server(settings, repository, tmp_path_factory.mktemp("server"))
    yield triton
    triton.stop()


@pytest.fixture(scope="session")
def two_stage_server(settings, exported, tmp_path_factory):
    """The same model in the two-stage topology (tokenizer -> encoder), beside the default one-stage server."""
    from model_repository.generate import generate

    two_stage = dataclasses.replace(settings, ensemble=dataclasses.replace(settings.ensemble, topology="two_stage"))
    root = generate(two_stage, exported, tmp_path_factory.mktemp("repo_two_stage") / "repository")
    triton = start_server(two_stage, root, tmp_path_factory.mktemp("server_two_stage"))
    yield triton
    triton.stop()


@pytest.fixture(params=["one_stage", "two_stage"])
def topology_server(request):
    """Each topology's server in turn: what clients see must not depend on it."""
    return request.getfixturevalue("server" if request.param == "one_stage" else "two_stage_server")


@pytest.fixture(scope="session")
def reference_model():
    """sentence-transformers on the same checkpoint: the numerics reference."""
    from sentence_transformers import SentenceTransformer

    from export.checkpoint import resolve_source

    return SentenceTransformer(str(resolve_source(load_settings().model.source)), device="cpu")


@pytest.fixture(scope="session")
def classification_export(settings, tmp_path_factory) -> Path:
    """A small random-init BERT with a 2-label head (labels from config.id2label)."""
    from export.__main__ import export

    out = tmp_path_factory.mktemp("export_classification")
    export(
        "random-init:bert-tiny",
        "classification",
        settings.model.max_tokens,
        out,
        settings.engine.onnx_opset,
        settings.engine.onnx_tolerance,
    )
    return out


@pytest.fixture(scope="session")
def golden_sequences() -> list:
    import numpy as np

    data = np.load(Path(__file__).parent / "golden" / "minilm.npz")
    return np.split(data["ids"], np.cumsum(data["lengths"])[:-1])
