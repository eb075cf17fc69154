"""Every checkpoint as its library saved it exports, and the stage serves what that library gives for it.

make compat-fixtures has each writer environment (sentence-transformers 2.7 to the newest, PyLate, FlagEmbedding:
tests/compat/) save its checkpoints under build/compat/fixtures/<writer>/<case>/ with its own outputs beside them
(reference.npz) and what they are (fixture.json). Each is exported here as a user would (max_tokens 0: the
checkpoint's own limit) and served through the one-stage model's execute() (prompts, lowercasing, truncation and
the task's head as served) on onnxruntime_cpu and on the torch engine (CPU, fp32): embeddings at cosine >= 0.9999
and within 1e-5 (of the largest value, where that is over 1), a reranker's sigmoid scores within 1e-5 in the same
order, a classifier's logits within 1e-5, sparse vectors of the same terms with weights within 1e-4, every kept
token vector at cosine >= 0.9999, BGE-M3's three outputs as tests/model/test_hybrid.py holds them. A checkpoint the
export cannot serve is refused naming the module, the key and the value (fixture.json's refused).

Without fixtures (make test alone) the module skips; make test-compat names its writers (COMPAT_WRITERS), and a
writer without fixtures then fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from common.contract import SPARSE_INDICES, SPARSE_VALUES, TOKEN_COUNTS, TOKEN_VECTORS, TOKENS_OUTPUT
from export.__main__ import export
from export.checkpoint import CheckpointError
from export.onnx_export import VALIDATION_SENTENCES
from model_repository.stages import stage_core
from protocol.multi_vector import token_vectors
from settings import ROOT
from tests.model.test_stage_execute import Request, loaded_stage

pytestmark = pytest.mark.checkpoints

FIXTURES = ROOT / "build" / "compat" / "fixtures"
WRITERS = os.environ.get("COMPAT_WRITERS", "").split()  # what make test-compat built: each must have fixtures
FOLDERS = sorted(path.parent for path in FIXTURES.glob("*/*/fixture.json"))
if not FOLDERS and not WRITERS:
    pytest.skip(
        f"no checkpoint fixtures in {FIXTURES}: make test-compat builds and tests them", allow_module_level=True
    )

ENGINES = ("onnxruntime_cpu", "torch")
MEANINGFUL = 1e-5  # a sparse weight this small is an activation's input within rounding of 0: either side is right
ALL_HYBRID = ("embedding", SPARSE_INDICES, SPARSE_VALUES, TOKEN_VECTORS, TOKEN_COUNTS, TOKENS_OUTPUT)


@dataclass(frozen=True)
class Saved:
    name: str  # writer/case
    meta: dict  # fixture.json
    reference: dict[str, np.ndarray]
    export_dir: Path | None
    error: CheckpointError | None  # the export's refusal

    @property
    def texts(self) -> list[str]:
        return self.reference["texts"].tolist()

    def rows(self, prefix: str, key: str = "rows") -> list[np.ndarray]:
        """A ragged reference (each text's token vectors, or sparse weights and their `indices`) split per text."""
        counts = self.reference[f"{prefix}_counts"]
        return np.split(self.reference[f"{prefix}_{key}"], np.cumsum(counts)[:-1])


def test_every_writer_wrote_its_fixtures():
    """make test-compat's writers each saved checkpoints (a writer that failed or was skipped fails here)."""
    written = {path.parent.name for path in FOLDERS}
    assert not set(WRITERS) - written, f"no fixtures from {sorted(set(WRITERS) - written)} in {FIXTURES}"


@pytest.fixture(scope="module", params=FOLDERS, ids=lambda folder: f"{folder.parent.name}/{folder.name}")
def saved(request, tmp_path_factory):
    """The fixture's checkpoint exported (or refused), removed after its tests (tens of MB each)."""
    folder = request.param
    meta = json.loads((folder / "fixture.json").read_text())
    with np.load(folder / "reference.npz") as arrays:
        reference = dict(arrays)
    out = tmp_path_factory.mktemp(folder.name)
    name = f"{folder.parent.name}/{folder.name}"
    try:
        # A short calibration corpus: the shipped one costs seconds per export, and no test here reads it.
        export(
            str(folder / "checkpoint"),
            meta["task"],
            0,
            out / "export",
            17,
            1e-4,
            calibration_corpus=VALIDATION_SENTENCES,
        )
    except CheckpointError as exc:
        yield Saved(name, meta, reference, None, exc)
    else:
        yield Saved(name, meta, reference, out / "export", None)
    shutil.rmtree(out)


def test_the_export_takes_it_or_refuses_naming_why(saved):
    refused = saved.meta["refused"]
    if refused is None:
        assert saved.error is None, f"{saved.name} ({saved.meta['version']}) refused: {saved.error}"
        return
    assert saved.error is not None, f"{saved.name} exported; expected a refusal naming {refused}"
    message = str(saved.error).lower()
    missing = [refused[part] for part in ("module", "key", "value") if refused[part].lower() not in message]
    assert not missing, f"the refusal does not name {missing}: {saved.error}"


@pytest.fixture(params=ENGINES)
def stage(saved, settings, monkeypatch, tmp_path, request):
    """The one-stage model on a repository generated for the engine from the export (removed after the test)."""
    if saved.meta["refused"] is not None:
        pytest.skip("refused at export (test_the_export_takes_it_or_refuses_naming_why)")
    if saved.error is not None:  # the test fails, naming the refusal
        yield None
        return
    chosen = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, task=saved.meta["task"], max_tokens=0),
        engine=dataclasses.replace(settings.engine, kind=request.param, precision="fp32"),
    )
    instance = loaded_stage(monkeypatch, chosen, saved.export_dir, tmp_path / "repo", "pipeline_model")
    yield instance
    instance.finalize()
    shutil.rmtree(tmp_path / "repo")


def served(stage, request: Request) -> dict[str, np.ndarray]:
    (response,) = stage.execute([request])
    assert response.error is None, response.error.message
    return response.outputs


def test_the_stage_serves_what_the_library_gives(saved, stage, monkeypatch):
    if stage is None:
        pytest.fail(f"{saved.name} ({saved.meta['version']}) refused at export: {saved.error}")
    print(f"{saved.name}: {saved.meta['library']} {saved.meta['version']}, transformers {saved.meta['transformers']}")
    if saved.meta["round_trip"]:  # the library's own save loses something (check_embedding takes either side)
        print(f"the library's save does not round-trip: {saved.meta['round_trip']}")
    CHECKS[saved.meta["task"]](saved, stage, monkeypatch)


def check_embedding(saved, stage, monkeypatch) -> None:
    """encode()'s; where the library's save does not round-trip (before_save), either the outputs it loads back
    or those of the model before its save: the saved folder may say what its library then loses."""
    embeddings = served(stage, Request(saved.texts))["embedding"]
    if "before_save" in saved.reference:
        expected = [saved.reference["embeddings"], saved.reference["before_save"]]
        best = max(expected, key=lambda rows: cosines(embeddings, rows).min())
        print("served as", "loaded back" if best is expected[0] else "before the save")
        assert_close_rows(embeddings, best)
    else:
        assert_close_rows(embeddings, saved.reference["embeddings"])
    if "prompt_document" in saved.reference:  # a named prompt instead of the default one
        named = served(stage, Request(saved.texts, {"prompt_name": "document"}))["embedding"]
        assert_close_rows(named, saved.reference["prompt_document"])


def assert_close_rows(served_rows: np.ndarray, expected: np.ndarray) -> None:
    assert served_rows.shape == expected.shape, f"served {served_rows.shape}, the reference {expected.shape}"
    cosine = cosines(served_rows, expected)
    assert cosine.min() >= 0.9999, f"cosine {cosine.min():.6f} (text {cosine.argmin()})"
    # 1e-5 of the largest value: pooling without Normalize (max, mean_sqrt_len) reaches several units.
    np.testing.assert_allclose(served_rows, expected, atol=1e-5 * max(1.0, np.abs(expected).max()), rtol=0)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def check_rerank(saved, stage, monkeypatch) -> None:
    request = Request(saved.reference["passages"].tolist())
    request["query"] = np.array([[query.encode()] for query in saved.reference["queries"]], dtype=np.object_)
    logits = served(stage, request)["score"].reshape(-1).astype(np.float64)
    scores, expected = 1.0 / (1.0 + np.exp(-logits)), saved.reference["scores"]
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    assert list(np.argsort(-scores)) == list(np.argsort(-expected))


def check_classification(saved, stage, monkeypatch) -> None:
    """The head's logits (as the stage hands them to its softmax), and the labels where the reference's top two
    logits are apart."""
    seen, heads = [], stage_core.scores_and_labels

    def kept(logits: np.ndarray, labels: np.ndarray):
        seen.append(logits.copy())
        return heads(logits, labels)

    monkeypatch.setattr(stage_core, "scores_and_labels", kept)
    labels = served(stage, Request(saved.texts))["label"].reshape(-1)
    expected = saved.reference["logits"]
    np.testing.assert_allclose(seen[0], expected, atol=1e-5, rtol=0)
    top = np.sort(expected, axis=1)
    clear = top[:, -1] - top[:, -2] > 1e-4
    wanted = saved.reference["labels"][expected.argmax(1)]
    assert [label.decode() for label in labels[clear]] == wanted[clear].tolist()


def check_sparse(saved, stage, monkeypatch) -> None:
    """Documents as the default, and (an inference-free model) queries with input_type query: every term."""
    sides = ("document", "query") if saved.meta["options"].get("router") else ("document",)
    for side in sides:
        parameters = {
            "sparse_top_k": 0,
            "sparse_threshold": 0.0,
            **({"input_type": "query"} if side == "query" else {}),
        }
        outputs = served(stage, Request(saved.texts, parameters))
        expected = zip(saved.rows(side, "indices"), saved.rows(side), strict=True)
        for text, (indices, values, (want_indices, want_values)) in enumerate(
            zip(outputs[SPARSE_INDICES], outputs[SPARSE_VALUES], expected, strict=True)
        ):
            got = dict(zip(indices[indices >= 0].tolist(), values[indices >= 0].tolist(), strict=True))
            want = dict(zip(want_indices.tolist(), want_values.tolist(), strict=True))
            assert_same_terms(got, want, f"{side} {text}")


def assert_same_terms(got: dict[int, float], want: dict[int, float], what: str) -> None:
    meaningful = {k for k, v in got.items() if v > MEANINGFUL}, {k for k, v in want.items() if v > MEANINGFUL}
    assert meaningful[0] == meaningful[1], f"{what}: terms {sorted(meaningful[0] ^ meaningful[1])[:10]} differ"
    far = [k for k in got.keys() & want.keys() if abs(got[k] - want[k]) > 1e-4]
    assert not far, f"{what}: weights of {far[:10]} differ by more than 1e-4"


def check_multi_vector(saved, stage, monkeypatch) -> None:
    for side in ("query", "document"):
        outputs = served(stage, Request(saved.texts, {"input_type": side}))
        expected = saved.rows(side)
        assert outputs[TOKEN_COUNTS].reshape(-1).tolist() == [len(rows) for rows in expected], f"{side} counts"
        for text, (vectors, want) in enumerate(zip(token_vectors(outputs, np.float32), expected, strict=True)):
            assert_close_vectors(vectors, want, f"{side} {text}")


def assert_close_vectors(got: np.ndarray, want: np.ndarray, what: str) -> None:
    cosine = cosines(got, want)
    assert cosine.min() >= 0.9999, f"{what}: token {cosine.argmin()} at cosine {cosine.min():.6f}"


def check_hybrid(saved, stage, monkeypatch) -> None:
    """BGEM3FlagModel.encode's three outputs from one execute()."""
    outputs = served(stage, Request(saved.texts, asked=ALL_HYBRID))
    np.testing.assert_allclose(outputs["embedding"], saved.reference["dense"], atol=1e-5, rtol=0)
    lexical = zip(saved.rows("lexical", "indices"), saved.rows("lexical"), strict=True)
    for text, (indices, values, (want_indices, want_values)) in enumerate(
        zip(outputs[SPARSE_INDICES], outputs[SPARSE_VALUES], lexical, strict=True)
    ):
        got = dict(zip(indices[indices >= 0].tolist(), values[indices >= 0].tolist(), strict=True))
        assert_same_terms(got, dict(zip(want_indices.tolist(), want_values.tolist(), strict=True)), f"lexical {text}")
    counts = outputs[TOKEN_COUNTS].reshape(-1)
    for text, (vectors, count, want) in enumerate(
        zip(token_vectors(outputs, np.float32), counts, saved.rows("colbert"), strict=True)
    ):
        assert count == len(want), f"colbert {text}: {count} vectors, the reference {len(want)}"
        assert_close_vectors(vectors, want, f"colbert {text}")


CHECKS = {
    "embedding": check_embedding,
    "rerank": check_rerank,
    "classification": check_classification,
    "sparse": check_sparse,
    "multi_vector": check_multi_vector,
    "hybrid": check_hybrid,
}
