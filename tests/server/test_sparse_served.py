"""Sparse models served (task sparse): one tritonserver and one launcher for a BERT SPLADE on onnxruntime_cpu (the
first model: TEI's routes reach it) beside a DistilBERT doc model (log1p_relu) on the torch engine, both tiny
SparseEncoder checkpoints (tests/checkpoints.py). TEI's /embed_sparse (and POST /) and this project's gRPC client
give what SparseEncoder.encode gives, each request cut as it asks; every bad field is a 400 naming it, and the
server keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from client import ClientError, TextClient
from loadtest.corpus import load_text
from tests.checkpoints import make_sparse_checkpoint
from tests.server.served_checkpoints import Model, served
from tests.support import api_post, api_url

# name -> (model_type, SpladePooling activation, engine.kind)
MODELS = {"splade": ("bert", "relu", "onnxruntime_cpu"), "opensearch-doc": ("distilbert", "log1p_relu", "torch")}
MAX_TOKENS = 128
TEXTS = load_text()[:12]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("sparse_checkpoints")
    return {name: make_sparse_checkpoint(work / name, model_type, activation=activation)
            for name, (model_type, activation, _) in MODELS.items()}  # fmt: skip


@pytest.fixture(scope="module")
def launcher(checkpoints, settings, tmp_path_factory):
    models = [Model(checkpoints[name], name, "sparse", MAX_TOKENS, kind) for name, (_, _, kind) in MODELS.items()]
    with served(models, settings, tmp_path_factory.mktemp("sparse_served")) as started:
        yield started


def sparse_encoder(checkpoint) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(checkpoint), device="cpu")
    model.max_seq_length = MAX_TOKENS
    return model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()


def dense(rows: list[tuple], vocabulary: int) -> np.ndarray:
    out = np.zeros((len(rows), vocabulary), dtype=np.float32)
    for row, (indices, values) in zip(out, rows, strict=True):
        row[indices] = values
    return out


def tei_rows(answer: list) -> list[tuple]:
    return [([entry["index"] for entry in row], [entry["value"] for entry in row]) for row in answer]


def test_tei_embed_sparse_gives_the_sparse_encoders_weights(launcher, checkpoints):
    """TEI's shape, [[{"index", "value"}, ...], ...], indices ascending; POST / answers the same."""
    expected = sparse_encoder(checkpoints["splade"])
    status, answer = api_post(launcher, "/embed_sparse", {"inputs": TEXTS})
    assert status == 200 and len(answer) == len(TEXTS), answer
    assert all(np.all(np.diff(indices) > 0) for indices, _ in tei_rows(answer))
    np.testing.assert_allclose(dense(tei_rows(answer), expected.shape[1]), expected, atol=1e-4, rtol=0)
    status, root = api_post(launcher, "/", {"inputs": TEXTS[0]})
    (alone,), (batched,) = tei_rows(root), tei_rows(answer[:1])
    assert status == 200 and alone[0] == batched[0]
    # fp32 rounding moves with the batch's padding: a few ulps of each weight (1.5e-6 of 0.12 seen)
    np.testing.assert_allclose(alone[1], batched[1], rtol=2e-5, atol=1e-6)


def test_tei_top_k_and_threshold_cut_each_text(launcher):
    status, whole = api_post(launcher, "/embed_sparse", {"inputs": TEXTS[:3]})
    status, top = api_post(launcher, "/embed_sparse", {"inputs": TEXTS[:3], "top_k": 5, "threshold": 0.01})
    assert status == 200
    for full, cut in zip(whole, top, strict=True):
        kept = sorted((entry for entry in full if entry["value"] > 0.01), key=lambda e: -e["value"])[:5]
        assert cut == sorted(kept, key=lambda entry: entry["index"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": "x", "top_k": 0}, "top_k"),
        ({"inputs": "x", "top_k": "5"}, "top_k"),
        ({"inputs": "x", "threshold": -1}, "threshold"),
        ({"inputs": "x", "normalize": True}, "normalize"),
        ({"inputs": "x", "input_type": "both"}, "input_type"),
        ({"inputs": 3}, "inputs"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(launcher, body, param):
    status, answer = api_post(launcher, "/embed_sparse", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert api_post(launcher, "/embed_sparse", {"inputs": "still served"})[0] == 200


def test_dense_routes_send_the_caller_to_embed_sparse(launcher):
    """The OpenAI route names the route for a sparse model; TEI's /embed finds no dense model here."""
    status, answer = api_post(launcher, "/v1/embeddings", {"model": "splade", "input": "x"})
    assert status == 400 and "use POST /embed_sparse" in answer["error"]["message"], answer
    status, answer = api_post(launcher, "/embed", {"inputs": "x"})
    assert status == 400 and "serves no embedding model" in answer["error"]["message"], answer


def test_the_grpc_client_reads_the_sparse_outputs(launcher, checkpoints):
    """The torch engine's doc model over gRPC: SparseEncoder's weights; top_k and threshold as KServe parameters;
    a bad parameter fails its request with the parameter named."""
    expected = sparse_encoder(checkpoints["opensearch-doc"])
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", model="opensearch-doc") as client:
        rows = client.embed_sparse(TEXTS)
        assert all(indices.dtype == np.int32 and values.dtype == np.float32 for indices, values in rows)
        np.testing.assert_allclose(dense(rows, expected.shape[1]), expected, atol=1e-4, rtol=0)
        top = client.embed_sparse(TEXTS, top_k=3, threshold=0.0)
        assert [len(indices) for indices, _ in top] == [min(3, int((row > 0).sum())) for row in expected]
        with pytest.raises(ClientError, match="sparse_top_k"):
            client.infer(TEXTS[:1], parameters={"sparse_top_k": -2})
        assert len(client.embed_sparse(TEXTS[:1])) == 1


def test_the_cli_prints_each_texts_entries(launcher):
    command = [sys.executable, "-m", "client", "embed-sparse", "--url", f"127.0.0.1:{launcher.ports.grpc}",
               "--model", "splade", "--top-k", "4", *TEXTS[:2]]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)["sparse"]
    assert [len(row) for row in printed] == [4, 4] and set(printed[0][0]) == {"index", "value"}
    assert api_url(launcher)  # the API front serves beside it (the tests above)
