"""A hybrid (BGE-M3) model served: one tritonserver and one launcher for a tiny checkpoint laid out as BAAI/bge-m3's
(tests/checkpoints.py) on onnxruntime_cpu, with ensemble.max_batch_size 4 so that a request of more texts is split
and joined. POST /encode answers the outputs asked for, each as FlagEmbedding's BGEM3FlagModel.encode gives it; the
routes of each output alone (the OpenAI SDK's embeddings, TEI's /embed_sparse and /embed_all, the gRPC client) give
the same; every bad field is a 400 naming it, and the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest

from client import TextClient
from loadtest.corpus import load_text
from tests.checkpoints import make_hybrid_checkpoint
from tests.model.flag_reference import m3_embedder
from tests.server.served_checkpoints import Model, served
from tests.support import api_post, api_url

MAX_TOKENS = 128
MAX_BATCH = 4
TEXTS = [*load_text()[:6], "Triton Triton Triton"]
MEANINGFUL = 1e-5  # a lexical weight this small is a ReLU input within rounding of 0: either side of it is right


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_hybrid_checkpoint(tmp_path_factory.mktemp("bge_m3_checkpoint") / "bge-m3")


@pytest.fixture(scope="module")
def reference(checkpoint) -> dict:
    with pytest.MonkeyPatch.context() as monkeypatch:
        model = m3_embedder(monkeypatch)(str(checkpoint), use_fp16=False, devices="cpu")
        return model.encode(TEXTS, max_length=MAX_TOKENS, return_dense=True, return_sparse=True,
                            return_colbert_vecs=True)  # fmt: skip


@pytest.fixture(scope="module")
def launcher(checkpoint, settings, tmp_path_factory):
    model = Model(checkpoint, "bge-m3", "hybrid", MAX_TOKENS, sections=f"[ensemble]\nmax_batch_size = {MAX_BATCH}\n")
    with served([model], settings, tmp_path_factory.mktemp("hybrid_served")) as started:
        yield started


def assert_lexical(served: list[dict], wanted: list[dict]) -> None:
    """The same token ids weigh something, each weight within 1e-4 (keys: token ids as strings)."""
    for got, expected in zip(served, wanted, strict=True):
        got = {int(key): float(value) for key, value in got.items()}
        expected = {int(key): float(value) for key, value in expected.items()}
        assert {k for k, v in got.items() if v > MEANINGFUL} == {k for k, v in expected.items() if v > MEANINGFUL}
        for key in got.keys() & expected.keys():
            assert got[key] == pytest.approx(expected[key], abs=1e-4)


def assert_colbert(served: list, wanted: list[np.ndarray]) -> None:
    assert [len(vectors) for vectors in served] == [len(vectors) for vectors in wanted]
    for vectors, expected in zip(served, wanted, strict=True):
        vectors = np.asarray(vectors, dtype=np.float32)
        cosine = (vectors * expected).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1))
        assert cosine.min() >= 0.9999, cosine.min()


def test_encode_answers_the_three_outputs_of_one_pass(launcher, reference):
    body = {"inputs": TEXTS, "return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    status, answer = api_post(launcher, "/encode", body)
    assert status == 200, answer
    assert set(answer) == {"dense_vecs", "lexical_weights", "colbert_vecs"}
    np.testing.assert_allclose(np.array(answer["dense_vecs"]), reference["dense_vecs"], atol=1e-5)
    assert_lexical(answer["lexical_weights"], reference["lexical_weights"])
    assert_colbert(answer["colbert_vecs"], reference["colbert_vecs"])


def test_encode_answers_only_what_is_asked(launcher, reference):
    """BGEM3FlagModel.encode's defaults: dense only; sparse alone, cut to top_k."""
    status, answer = api_post(launcher, "/encode", {"inputs": TEXTS[0]})
    assert status == 200 and set(answer) == {"dense_vecs"}
    body = {"inputs": TEXTS[:2], "return_dense": False, "return_sparse": True, "top_k": 2}
    status, answer = api_post(launcher, "/encode", body)
    assert status == 200 and set(answer) == {"lexical_weights"}
    for got, expected in zip(answer["lexical_weights"], reference["lexical_weights"][:2], strict=True):
        top = sorted(expected.values(), reverse=True)[:2]
        assert sorted(got.values(), reverse=True) == pytest.approx(top, abs=1e-4)


def test_each_outputs_own_route_takes_the_hybrid_model(launcher, reference):
    from openai import OpenAI

    client = OpenAI(base_url=api_url(launcher) + "/v1", api_key="unused")
    dense = client.embeddings.create(model="bge-m3", input=TEXTS).data
    np.testing.assert_allclose(np.array([row.embedding for row in dense]), reference["dense_vecs"], atol=1e-5)
    status, sparse = api_post(launcher, "/embed_sparse", {"inputs": TEXTS})
    assert status == 200, sparse
    assert_lexical([{row["index"]: row["value"] for row in text} for text in sparse], reference["lexical_weights"])
    status, vectors = api_post(launcher, "/embed_all", {"inputs": TEXTS})
    assert status == 200, vectors
    assert_colbert(vectors, reference["colbert_vecs"])
    body = {"model": "bge-m3", "texts": TEXTS[:2], "input_type": "search_document", "embedding_types": ["int8"]}
    status, quantized = api_post(launcher, "/v2/embed", body)
    assert status == 200 and len(quantized["embeddings"]["int8"]) == 2, quantized


def test_the_grpc_client_reads_dense_and_sparse(launcher, reference):
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc") as client:
        np.testing.assert_allclose(client.embed(TEXTS), reference["dense_vecs"], atol=1e-5)
        served = [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in client.embed_sparse(TEXTS)]
        assert_lexical(served, reference["lexical_weights"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": "x", "return_dense": "yes"}, "return_dense"),
        ({"inputs": "x", "return_dense": False}, "return_dense"),
        ({"inputs": "x", "return_sparse": True, "top_k": 0}, "top_k"),
        ({"inputs": "x", "return_colbert": True}, "return_colbert"),
        ({"inputs": 3}, "inputs"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(launcher, body, param):
    status, answer = api_post(launcher, "/encode", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert api_post(launcher, "/encode", {"inputs": "still served"})[0] == 200
