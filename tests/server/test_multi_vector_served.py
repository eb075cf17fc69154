"""A multi-vector model served (task multi_vector): one tritonserver and one launcher for a tiny ColBERT
MultiVectorEncoder checkpoint (tests/checkpoints.py) on onnxruntime_cpu, with ensemble.max_batch_size 4 so that
a request of more texts is split and its token vectors joined. TEI's /embed_all gives, for queries and documents,
what encode_query / encode_document give; /colbert/score ranks documents by the reference's MaxSim; the gRPC client
and the CLI read the same vectors; every bad field is a 400 naming it, and the server keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client import ClientError, TextClient
from loadtest.corpus import load_text
from tests.checkpoints import make_multi_vector_checkpoint
from tests.server.served_checkpoints import Model, served
from tests.support import api_post

sentence_transformers = pytest.importorskip("sentence_transformers")

MAX_TOKENS = 128
MAX_BATCH = 4
DOCUMENTS = [*load_text()[:9], "!!! ... ???"]  # the last keeps only its specials and prompt: punctuation is skipped
QUERIES = ["What is Triton?", "how do ColBERT's [MASK]s work", " ".join(["a long query"] * 40)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_multi_vector_checkpoint(tmp_path_factory.mktemp("colbert_checkpoint") / "colbert")


@pytest.fixture(scope="module")
def reference(checkpoint):
    return sentence_transformers.MultiVectorEncoder(str(checkpoint), device="cpu")


@pytest.fixture(scope="module")
def launcher(checkpoint, settings, tmp_path_factory):
    sections = f"[ensemble]\nmax_batch_size = {MAX_BATCH}\n"
    model = Model(checkpoint, "colbert", "multi_vector", MAX_TOKENS, sections=sections)
    with served([model], settings, tmp_path_factory.mktemp("multi_vector_served")) as started:
        yield started


def expected(reference, texts: list[str], side: str) -> list[np.ndarray]:
    encode = reference.encode_query if side == "query" else reference.encode_document
    return [np.asarray(vectors, dtype=np.float32) for vectors in encode(texts, convert_to_numpy=True)]


def assert_same_vectors(served: list, wanted: list[np.ndarray]) -> None:
    """The same tokens kept, each vector's direction within 1e-4 of the reference's."""
    assert [len(vectors) for vectors in served] == [len(vectors) for vectors in wanted]
    for vectors, reference_vectors in zip(served, wanted, strict=True):
        vectors = np.asarray(vectors, dtype=np.float32)
        cosine = (vectors * reference_vectors).sum(1) / (
            np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference_vectors, axis=1)
        )
        assert cosine.min() >= 0.9999, cosine.min()


@pytest.mark.parametrize("side", ["query", "document"])
def test_tei_embed_all_gives_the_encoders_token_vectors(launcher, reference, side):
    """input_type and TEI's prompt_name both pick the side; more texts than max_batch_size are joined."""
    texts = QUERIES if side == "query" else DOCUMENTS
    wanted = expected(reference, texts, side)
    status, answer = api_post(launcher, "/embed_all", {"inputs": texts, "input_type": side})
    assert status == 200, answer
    assert_same_vectors(answer, wanted)
    status, by_prompt = api_post(launcher, "/embed_all", {"inputs": texts[:1], "prompt_name": side})
    assert status == 200 and len(by_prompt[0]) == len(wanted[0])


def test_documents_are_the_default_side_and_post_root_answers_embed_all(launcher, reference):
    wanted = expected(reference, DOCUMENTS[:2], "document")
    assert_same_vectors(api_post(launcher, "/embed_all", {"inputs": DOCUMENTS[:2]})[1], wanted)
    status, answer = api_post(launcher, "/", {"inputs": DOCUMENTS[:2]})
    assert status == 200
    assert_same_vectors(answer, wanted)


def test_colbert_score_ranks_documents_by_the_encoders_maxsim(launcher, reference):
    question = QUERIES[0]
    wanted = reference.similarity(expected(reference, [question], "query"), expected(reference, DOCUMENTS, "document"))
    wanted = wanted.numpy().reshape(-1)
    status, answer = api_post(launcher, "/colbert/score", {"query": question, "documents": DOCUMENTS})
    assert status == 200, answer
    assert sorted(rank["index"] for rank in answer) == list(range(len(DOCUMENTS)))
    assert [rank["score"] for rank in answer] == sorted((rank["score"] for rank in answer), reverse=True)
    scores = np.array([rank["score"] for rank in sorted(answer, key=lambda rank: rank["index"])])
    np.testing.assert_allclose(scores, wanted, atol=1e-4, rtol=1e-4)  # the vectors come as fp16: 2^-11 each


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/embed_all", {"inputs": "x", "input_type": "passage"}, "input_type"),
        ("/embed_all", {"inputs": "x", "prompt_name": "search"}, "prompt_name"),
        ("/embed_all", {"inputs": "x", "normalize": True}, "normalize"),
        ("/embed_all", {"inputs": "x", "truncation_direction": "left"}, "truncation_direction"),
        ("/embed_all", {"inputs": 3}, "inputs"),
        ("/colbert/score", {"query": "x"}, "documents"),
        ("/colbert/score", {"query": 3, "documents": ["x"]}, "query"),
        ("/colbert/score", {"query": "x", "documents": "x"}, "documents"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(launcher, path, body, param):
    status, answer = api_post(launcher, path, body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert api_post(launcher, "/embed_all", {"inputs": "still served"})[0] == 200


def test_truncate_false_refuses_a_text_over_its_sides_length(launcher):
    status, answer = api_post(
        launcher, "/embed_all", {"inputs": [QUERIES[2]], "input_type": "query", "truncate": False}
    )
    assert status == 413 and "a query takes at most" in answer["error"]["message"], answer


def test_dense_routes_send_the_caller_to_the_multi_vector_routes(launcher):
    for path, body in (("/v1/embeddings", {"model": "colbert", "input": "x"}), ("/embed", {"inputs": "x"})):
        status, answer = api_post(launcher, path, body)
        assert status == 400 and "use POST /embed_all or /colbert/score" in answer["error"]["message"], answer


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_client_reads_each_texts_token_vectors(launcher, reference, protocol):
    """Over gRPC and KServe HTTP: split into requests of max_batch_size texts, joined, cut to each text's count
    (fp16 views); a bad side is named."""
    port = launcher.ports.grpc if protocol == "grpc" else launcher.ports.http
    with TextClient(f"{protocol}://127.0.0.1:{port}") as client:
        for side, texts in (("query", QUERIES), ("document", DOCUMENTS)):
            vectors = client.embed_multi_vector(texts, input_type=side)
            assert all(rows.dtype == np.float16 for rows in vectors)
            assert_same_vectors(vectors, expected(reference, texts, side))
        with pytest.raises(ClientError, match="input_type"):
            client.infer(DOCUMENTS[:1], parameters={"input_type": "passage"})
        with pytest.raises(ValueError, match="input_type"):
            client.embed_multi_vector(DOCUMENTS[:1], input_type="passage")


def test_kserve_answers_the_kept_vectors_packed_fp16_or_fp32_by_name(launcher, reference):
    """Over KServe gRPC: a request naming no output gets token_vectors FP16 [its kept tokens, dim], no padding (the
    answer's bytes are its kept vectors' own); one naming token_vectors_fp32 gets FP32, the same numbers before
    rounding to fp16."""
    texts = DOCUMENTS[:3]
    wanted = expected(reference, texts, "document")
    kept, dim = sum(len(rows) for rows in wanted), wanted[0].shape[1]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{launcher.ports.grpc}")
    text = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    fp16 = client.infer("ensemble", [text]).get_response()
    by_name = {tensor.name: (tensor, raw) for tensor, raw in zip(fp16.outputs, fp16.raw_output_contents, strict=True)}
    assert "token_vectors_fp32" not in by_name
    tensor, raw = by_name["token_vectors"]
    assert (tensor.datatype, list(tensor.shape), len(raw)) == ("FP16", [kept, dim], kept * dim * 2)
    names = [grpcclient.InferRequestedOutput(name) for name in ("token_vectors_fp32", "token_counts")]
    fp32 = client.infer("ensemble", [text], outputs=names)
    assert fp32.as_numpy("token_vectors") is None
    wide, narrow = fp32.as_numpy("token_vectors_fp32"), np.frombuffer(raw, np.float16).reshape(kept, dim)
    assert wide.dtype == np.float32 and wide.shape == (kept, dim)
    np.testing.assert_array_equal(wide.astype(np.float16), narrow)
    assert_same_vectors(np.split(wide, np.cumsum(fp32.as_numpy("token_counts").reshape(-1))[:-1]), wanted)
    client.close()


def test_concurrent_embed_all_requests_each_get_their_own_vectors(launcher, reference):
    """Documents from several callers at once share Triton calls (the API front's coalescer), which split the
    packed vectors back by each text's count."""
    parts = [DOCUMENTS[i : i + 2] for i in range(0, len(DOCUMENTS), 2)] * 3
    with ThreadPoolExecutor(len(parts)) as pool:
        answers = list(pool.map(lambda texts: api_post(launcher, "/embed_all", {"inputs": texts}), parts))
    for texts, (status, answer) in zip(parts, answers, strict=True):
        assert status == 200, answer
        assert_same_vectors(answer, expected(reference, texts, "document"))


def test_the_cli_prints_each_texts_token_vectors(launcher, reference):
    command = [sys.executable, "-m", "client", "embed-multi-vector", "--url", f"127.0.0.1:{launcher.ports.grpc}",
               "--input-type", "query", *QUERIES[:2]]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert_same_vectors(json.loads(run.stdout)["token_vectors"], expected(reference, QUERIES[:2], "query"))
