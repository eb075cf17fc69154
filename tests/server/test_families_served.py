"""Every family served as BERT is: one tritonserver and one launcher for an XLM-RoBERTa embedder beside an
XLM-RoBERTa reranker, a ModernBERT and an MPNet embedder, a RoBERTa reranker and a DistilBERT classifier (tiny
checkpoints of each family's own config class with trained tokenizers, tests/checkpoints.py), on both CPU engines,
the RoBERTa reranker in the two-stage topology.
Each client reaches its model with the calls it already makes (the OpenAI and Cohere SDKs, TEI's routes, this
project's gRPC client, Locust) and gets what sentence-transformers and transformers compute on the same checkpoint;
a text over a model's limit is truncated, or refused when the caller asks."""

from __future__ import annotations

import json
import subprocess
import sys

import cohere
import numpy as np
import openai
import pytest
import torch

from client import TextClient
from export.__main__ import export
from export.onnx_export import VALIDATION_SENTENCES
from export.tokenizer_training import MULTILINGUAL_SENTENCES
from loadtest.corpus import load_text
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_deployment
from tests.checkpoints import make_checkpoint
from tests.support import api_post, api_url

# name -> (model_type, task, engine.kind, max_tokens)
MODELS = {
    "xlmr-embedder": ("xlm-roberta", "embedding", "onnxruntime_cpu", 64),
    "xlmr-reranker": ("xlm-roberta", "rerank", "onnxruntime_cpu", 128),
    "modernbert": ("modernbert", "embedding", "torch", 256),
    "mpnet": ("mpnet", "embedding", "torch", 128),
    "roberta-reranker": ("roberta", "rerank", "torch", 128),
    "distilbert-classifier": ("distilbert", "classification", "onnxruntime_cpu", 128),
}
TWO_STAGE = {"roberta-reranker"}  # tokenizer -> encoder, the pair's ids handed on without token types
EMBEDDERS = [name for name, (_, task, _, _) in MODELS.items() if task == "embedding"]
RERANKERS = [name for name, (_, task, _, _) in MODELS.items() if task == "rerank"]
TEXTS = [*load_text()[:12], *MULTILINGUAL_SENTENCES.read_text().splitlines()[:12]]
QUERY = VALIDATION_SENTENCES.read_text().splitlines()[0]


# The MPNet embedder is saved with prompts and a default one: every way in reads a text behind it as encode() does.
PROMPTED = {"mpnet": {"prompts": {"query": "query: ", "document": "passage: "}, "default_prompt_name": "query"}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("family_checkpoints")
    return {name: make_checkpoint(work / name, model_type, task, **PROMPTED.get(name, {}))
            for name, (model_type, task, _, _) in MODELS.items()}  # fmt: skip


@pytest.fixture(scope="module")
def launcher(checkpoints, settings, tmp_path_factory):
    work = tmp_path_factory.mktemp("families_served")
    files = []
    for index, (name, (_, task, kind, max_tokens)) in enumerate(MODELS.items()):
        engine = settings.engine
        export(str(checkpoints[name]), task, max_tokens, work / "models" / name, engine.onnx_opset,
               engine.onnx_tolerance, onnx=kind != "torch")  # fmt: skip
        path = work / f"{name}.toml"
        path.write_text(
            f'[model]\nsource = "{checkpoints[name]}"\nname = "{name}"\ntask = "{task}"\nmax_tokens = {max_tokens}\n\n'
            f'[engine]\nkind = "{kind}"\nprecision = "fp32"\n\n[server]\nbuild_dir = "{work}"\n'
            + ('\n[ensemble]\ntopology = "two_stage"\n' if name in TWO_STAGE else "")
            + ("\n[api]\nworkers = 1\n" if index == 0 else "")
        )
        files.append(path)
    repository = generate(load_deployment(files))
    assert {f"{name}-encoder" for name in TWO_STAGE} <= {path.name for path in repository.iterdir()}
    started = Launcher(files, repository, Ports.free(), work / "launcher.log").start()
    yield started
    started.terminate()
    started.process.wait(timeout=60)


def sentence_transformer(path, max_tokens: int):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    model.max_seq_length = max_tokens
    return model


@pytest.mark.parametrize("name", EMBEDDERS)
def test_the_openai_sdk_gets_sentence_transformers_embeddings(launcher, checkpoints, name):
    """English and multilingual texts: cosine >= 0.9999 to SentenceTransformer on the same checkpoint."""
    sdk = openai.OpenAI(base_url=api_url(launcher) + "/v1", api_key="unused")
    answer = sdk.embeddings.create(model=name, input=TEXTS)
    served = np.array([row.embedding for row in answer.data])
    expected = sentence_transformer(checkpoints[name], MODELS[name][3]).encode(TEXTS, convert_to_numpy=True)
    cosine = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999, cosine


def test_a_default_prompt_is_read_by_every_way_in(launcher, checkpoints):
    """The MPNet embedder's default prompt: over gRPC (the stage puts it in front) and through the API front (which
    does, and asks the stage for none), as encode(); a named prompt as encode(prompt_name=...), an unknown one a 400."""
    model = sentence_transformer(checkpoints["mpnet"], MODELS["mpnet"][3])
    texts = TEXTS[:8]
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", model="mpnet") as client:
        close(client.infer(texts)["embedding"], model.encode(texts))
    cohere_answer = cohere.ClientV2(base_url=api_url(launcher), api_key="unused").embed(
        model="mpnet", texts=texts, input_type="search_document", embedding_types=["float"]
    )
    close(np.array(cohere_answer.embeddings.float_), model.encode(texts, prompt_name="document"))
    status, answer = api_post(launcher, "/v2/embed", {"model": "mpnet", "texts": ["x"], "input_type": "clustering",
                                                      "embedding_types": ["float"]})  # fmt: skip
    assert status == 200, answer
    close(np.array(answer["embeddings"]["float"]), model.encode(["x"]))
    status, answer = api_post(launcher, "/v1/embeddings", {"model": "mpnet", "input": texts, "chunking": {}})
    assert status == 400 and "default prompt" in answer["error"]["message"], answer


def close(served: np.ndarray, expected: np.ndarray) -> None:
    cosine = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999, cosine


@pytest.mark.parametrize("name", RERANKERS)
def test_the_cohere_sdk_reranks_as_the_cross_encoder(launcher, checkpoints, name):
    """Pairs tokenized as the family does (<s> query </s></s> text </s>, no token types): the order identical and
    the scores within 1e-5 of CrossEncoder's."""
    from sentence_transformers import CrossEncoder

    documents = TEXTS[:16]
    answer = cohere.ClientV2(base_url=api_url(launcher), api_key="unused").rerank(
        model=name, query=QUERY, documents=documents
    )
    cross_encoder = CrossEncoder(str(checkpoints[name]), device="cpu", max_length=MODELS[name][3])
    expected = cross_encoder.predict([(QUERY, document) for document in documents])
    assert [result.index for result in answer.results] == list(np.argsort(-expected))
    served = np.array([result.relevance_score for result in answer.results])
    np.testing.assert_allclose(served, np.sort(expected)[::-1], atol=1e-5, rtol=0)


def test_tei_predict_classifies_as_transformers(launcher, checkpoints):
    import transformers

    name = "distilbert-classifier"
    status, answer = api_post(launcher, "/predict", {"inputs": TEXTS[:6]})
    assert status == 200 and len(answer) == 6
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoints[name]))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(checkpoints[name])).eval()
    with torch.no_grad():
        batch = tokenizer(TEXTS[:6], padding=True, truncation=True, max_length=MODELS[name][3], return_tensors="pt")
        expected = torch.softmax(model(**batch).logits, dim=-1).numpy()
    for row, probabilities in zip(answer, expected, strict=True):
        scores = {entry["label"]: entry["score"] for entry in row}
        np.testing.assert_allclose([scores[label] for label in model.config.id2label.values()], probabilities,
                                   atol=1e-5)  # fmt: skip


def test_a_text_over_the_limit_is_truncated_or_refused(launcher, checkpoints):
    """The XLM-R embedder keeps 64 tokens: a long multilingual text is served as SentenceTransformer truncates it
    (over gRPC), and refused with its token count when TEI's caller says truncate: false."""
    long = " ".join(TEXTS[12:])
    with TextClient(f"127.0.0.1:{launcher.ports.grpc}", "grpc", model="xlmr-embedder") as client:
        outputs = client.infer([long])
    served, (tokens,) = outputs["embedding"], outputs["tokens"].ravel()
    assert tokens == 64
    expected = sentence_transformer(checkpoints["xlmr-embedder"], 64).encode([long], convert_to_numpy=True)
    assert float((served * expected).sum() / np.linalg.norm(served) / np.linalg.norm(expected)) >= 0.9999
    # TEI routes name no model: they reach the first one, the XLM-R embedder
    status, answer = api_post(launcher, "/embed", {"inputs": long, "truncate": False})
    assert status == 413 and "the model takes at most 64" in answer["error"]["message"], answer


def test_locust_loads_a_family_model(launcher, tmp_path):
    """A short closed loop of 2 users on the ModernBERT embedder over gRPC: accepted, none failed."""
    command = [
        sys.executable, "-m", "loadtest", "--url", f"127.0.0.1:{launcher.ports.grpc}", "--protocol", "grpc",
        "--model", "modernbert", "--users", "2", "--duration", "5s", "--results", str(tmp_path),
        "--p50-ms", "2000", "--p99-ms", "4000", "--min-rps", "1", "--max-fail-ratio", "0", "--no-server-stats",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "loadtest.json").read_text())
    assert result["total"]["requests"] > 5 and result["total"]["failures"] == 0, result["total"]
