"""The README's hybrid retrieval as written: the three settings files its `make serve` names (the default embedder,
the SPLADE variant, the reranker variant) in one tritonserver and one launcher, and the README's Python block run
against the API front: dense vectors through the OpenAI SDK, sparse ones through TEI's /embed_sparse, a rerank of
the fused candidates through Cohere's SDK. A README block that breaks fails here."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from common.contract import ServingSpec
from export.__main__ import export
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import ROOT, load_deployment
from settings.loading import DEFAULT_SETTINGS
from tests.support import api_get, api_url

# The README's `make serve SETTINGS="..."`: the embedder, the sparse encoder, the reranker.
FILES = [ROOT / "settings" / name for name in ("defaults.toml", "variants/splade.toml", "variants/reranker.toml")]
MARKER = "<!-- hybrid retrieval: tests/server/test_hybrid_retrieval.py runs the python block below -->"
README_API = "http://127.0.0.1:8080"
# The SPLADE variant's random bert-base takes a minute to export on 2 cores; its export folder gets a random BERT-tiny
# of the same task and max_tokens (all that generate checks against the settings) instead.
STAND_INS = {"random-init:bert-base": "random-init:bert-tiny"}


def readme_example() -> str:
    match = re.search(re.escape(MARKER) + r"\n```python\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert match, f"README.md has no python block right after {MARKER}"
    return match.group(1)


@pytest.fixture(scope="module")
def launcher(exported, tmp_path_factory):
    work = tmp_path_factory.mktemp("hybrid_retrieval")
    overrides = [f'server.build_dir="{work}"']  # every file's exports and repository here, not in build/
    deployment = load_deployment(FILES, overrides)
    for model in deployment.models:
        if model.path == DEFAULT_SETTINGS.resolve():
            shutil.copytree(exported, model.export_dir)  # the session's export of the defaults
            continue
        engine = model.engine
        export(STAND_INS.get(model.model.source, model.model.source), model.model.task, model.model.max_tokens,
               model.export_dir, engine.onnx_opset, engine.onnx_tolerance, onnx=engine.kind != "torch")  # fmt: skip
    started = Launcher(FILES, generate(deployment), Ports.free(), work / "launcher.log", overrides).start()
    yield started
    started.terminate()
    started.process.wait(timeout=60)


def test_one_server_serves_the_three_files_models(launcher):
    assert [model["id"] for model in api_get(launcher, "/v1/models")["data"]] == [
        "all-MiniLM-L6-v2",
        "splade",
        "reranker",
    ]


def test_the_readme_example_makes_its_three_calls(launcher, exported, capsys):
    code = readme_example()
    assert README_API in code, f"the README's block no longer calls {README_API}: say where this test points it"
    scope: dict = {}
    exec(compile(code.replace(README_API, api_url(launcher)), "README.md (hybrid retrieval)", "exec"), scope)
    documents, vectors, rows = scope["documents"], scope["vectors"], scope["rows"]

    width = ServingSpec.load(exported).output_size
    assert vectors.shape == (1 + len(documents), width)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # the block's dot product is a cosine

    assert len(rows) == 1 + len(documents) and all(rows)
    for row in rows:
        indices = [entry["index"] for entry in row]
        assert all(type(index) is int for index in indices) and indices == sorted(set(indices))
        assert all(entry["value"] > 0 for entry in row)
    assert scope["sparse_scores"].shape == scope["dense_scores"].shape == (len(documents),)

    candidates, results = scope["candidates"], scope["reranked"].results
    assert len(set(candidates)) == len(candidates) == 3 and set(candidates) <= set(range(len(documents)))
    assert sorted(result.index for result in results) == [0, 1, 2]
    scores = [result.relevance_score for result in results]
    assert scores == sorted(scores, reverse=True)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("  ", 1)[1] for line in printed] == [documents[candidates[r.index]] for r in results]
