"""Shared fixtures: the settings, one export and one generated repository per test session (the servers on
them: tests/server/conftest.py).

tests/unit needs none of them; tests/model the checkpoint and its export; tests/server the servers; tests/chart the
chart.
The export and the repository are imported inside their fixtures: the GPU tests (make test-gpu) run where
neither tritonclient nor the Triton wheel is installed.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from serving.launcher.procfs import stub_argvs
from serving.launcher.shm import SHM_REGION_PREFIX
from settings import ROOT, load_settings
from tests.leftovers import leftovers

# What the session found when it started (stubs, shared-memory regions), and where its own files are.
_BEFORE = pytest.StashKey[tuple[set[int], set[str]]]()
_TEMP = pytest.StashKey[Path]()
_LEFT = pytest.StashKey[list[str]]()
LEFTOVER_GRACE_S = 15.0  # a server stopped by the last fixture may still be unloading


def pytest_sessionstart(session) -> None:
    regions = {region.name for region in Path("/dev/shm").glob(f"{SHM_REGION_PREFIX}*")}
    session.config.stash[_BEFORE] = (set(stub_argvs()), regions)


@pytest.fixture(scope="session", autouse=True)
def _session_temp(tmp_path_factory, pytestconfig):
    pytestconfig.stash[_TEMP] = tmp_path_factory.getbasetemp()


def pytest_sessionfinish(session, exitstatus) -> None:
    """No process and no shared memory may outlive the session: a stub left running holds ~230 MB (on a GPU, a
    CUDA context) and a region 16 MiB. Found ones fail the run, named."""
    roots = [ROOT, *([session.config.stash[_TEMP]] if _TEMP in session.config.stash else [])]
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := leftovers(session.config.stash[_BEFORE], roots)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        session.config.stash[_LEFT] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config) -> None:
    """What the session left, after pytest's own summary: CI shows the output's tail."""
    if left := config.stash.get(_LEFT, None):
        print("\nFAILED: the session left behind:\n  " + "\n  ".join(left), flush=True)


@pytest.fixture(scope="session")
def settings():
    """The defaults at engine.precision "fp32": the suites hold the serving path to fp32 exactness (a text's row
    is the same, to 1e-6, whatever it was batched with), which bf16, what "auto" serves on a CPU with AMX or
    AVX-512 BF16, does not give (~1e-3). tests/server/test_engine_choice_served.py serves the defaults as they are."""
    return load_settings(None, ['engine.precision="fp32"'])


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


@pytest.fixture(scope="session")
def trt_settings(settings, exported, tmp_path_factory):
    """The default model with engine.kind = tensorrt fp16 on GPU 0, exporting into its own folder."""
    build = tmp_path_factory.mktemp("trt_build")
    shutil.copytree(exported, build / "models" / settings.model.name)
    return dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, max_tokens=256),  # a plan's profiles need it set: MiniLM's own
        engine=dataclasses.replace(settings.engine, kind="tensorrt", precision="fp16"),
        encoder=dataclasses.replace(settings.encoder, gpus=(0,), instances=2),
        server=dataclasses.replace(settings.server, build_dir=str(build)),
    )


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory) -> Path:
    """A cross-encoder of random weights with a real vocabulary (tests/support.py make_cross_encoder)."""
    from tests.support import make_cross_encoder

    return make_cross_encoder(tmp_path_factory.mktemp("cross_encoder") / "checkpoint")


@pytest.fixture(scope="session")
def rerank_export(cross_encoder_dir, settings, tmp_path_factory) -> Path:
    """The cross-encoder exported as a reranker (task rerank, 128 tokens a pair)."""
    from export.__main__ import export

    out = tmp_path_factory.mktemp("export_rerank")
    export(str(cross_encoder_dir), "rerank", 128, out, settings.engine.onnx_opset, settings.engine.onnx_tolerance)
    return out


@pytest.fixture(scope="session")
def cross_encoder(cross_encoder_dir):
    """sentence-transformers' CrossEncoder on the same checkpoint: the reranking reference (sigmoid of the logit)."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu", max_length=128)
