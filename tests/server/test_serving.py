"""End-to-end: the real tritonserver serves the ensemble over gRPC and HTTP; numerics vs sentence-transformers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client import TextClient
from serving.launcher.harness import local_server
from tests.support import PROTOCOLS, url


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_embeddings_match_sentence_transformers(topology_server, reference_model, sentences, protocol):
    assert len(sentences) >= 20
    reference = reference_model.encode(sentences, batch_size=8, convert_to_numpy=True)
    with TextClient(url(topology_server, protocol), protocol) as client:
        served = np.concatenate([client.embed([text]) for text in sentences])
    similarity = cosine(served, reference)
    assert similarity.min() >= 0.9999, dict(zip(sentences, similarity.round(6), strict=True))


def test_mixed_length_batch_equals_single_requests(topology_server, sentences):
    texts = sorted(sentences, key=len)[::3]  # short to very long (truncated) in one request
    with TextClient(topology_server.grpc_url, "grpc") as client:
        batched = client.embed(texts)
        singles = np.concatenate([client.embed([text]) for text in texts])
    np.testing.assert_allclose(batched, singles, atol=2e-5)


def test_concurrent_requests_are_batched(topology_server, sentences):
    server = topology_server
    stats_client = grpcclient.InferenceServerClient(server.grpc_url)
    engine_model = "ensemble" if server.settings.topology == "one_stage" else "encoder"

    def counts():
        stats = stats_client.get_inference_statistics(engine_model, as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    before = counts()
    texts = (sentences * 4)[:96]
    with TextClient(server.grpc_url, "grpc", priority="ingestion") as client, ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda text: client.embed([text]), texts))
    assert all(r.shape == (1, 384) for r in results)
    deadline = time.monotonic() + 5  # Triton counts an execution after its responses went out
    while (inferences := counts()[0] - before[0]) < len(texts) and time.monotonic() < deadline:
        time.sleep(0.05)
    inferences, executions = (after - prior for after, prior in zip(counts(), before, strict=True))
    assert inferences == len(texts)
    assert executions < inferences, f"{executions} executions for {inferences} inferences: no dynamic batching"


def test_invalid_utf8_is_rejected_and_server_keeps_serving(topology_server):
    data = np.array([b"\xff\xfe not utf-8"], dtype=np.object_).reshape(1, 1)
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(data)
    with pytest.raises(Exception, match="not valid UTF-8"):
        grpcclient.InferenceServerClient(topology_server.grpc_url).infer("ensemble", [tensor])
    with TextClient(topology_server.grpc_url, "grpc") as client:
        assert client.embed(["still serving"]).shape == (1, 384)


@pytest.mark.parametrize(("topology", "protocol"), [("one_stage", "http"), ("two_stage", "grpc")])
def test_classification_returns_the_engines_scores_and_labels(
    settings, classification_export, tmp_path_factory, topology, protocol
):
    import dataclasses

    import torch
    import transformers

    from common.hf_tokenizer import load_tokenizer
    from model_repository.generate import generate
    from model_repository.stages.engines import load_engine

    cls_settings = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, task="classification"),
        ensemble=dataclasses.replace(settings.ensemble, topology=topology),
    )
    root = generate(cls_settings, classification_export, tmp_path_factory.mktemp("cls_repo") / "repo")
    server = local_server(cls_settings, root, tmp_path_factory.mktemp("cls_server")).start()
    texts = ["great movie", "terrible service, never again", "an average day"]
    try:
        with TextClient(url(server, protocol), protocol) as client:
            out = client.infer(texts)
    finally:
        server.stop()
    # The reference: PyTorch (transformers) on the exported checkpoint and the same token ids, softmax in float64.
    tokenizer = load_tokenizer(classification_export / "tokenizer.json", settings.max_tokens(classification_export))
    encoded = tokenizer.encode_batch(texts)
    ids = torch.zeros((len(texts), max(len(e.ids) for e in encoded)), dtype=torch.long)
    for row, encoding in enumerate(encoded):
        ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
    model = transformers.BertForSequenceClassification.from_pretrained(str(classification_export)).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.double().numpy()
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(out["scores"], expected, atol=1e-6, rtol=0)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    assert list(labels) == list(load_engine("onnxruntime_cpu", classification_export).spec.labels)
    assert list(out["label"].reshape(-1)) == [labels[i] for i in expected.argmax(1)]


@pytest.mark.parametrize(
    ("topology", "overrides", "message"),
    [
        ("one_stage", ["encoder.max_queue_size=2"], "exceeds maximum queue size"),
        ("two_stage", ["tokenizer.max_queue_size=2", "tokenizer.max_queue_delay_us=0"], "exceeds maximum queue size"),
        ("one_stage", ["encoder.queue_timeout_us=2000"], "timeout"),
    ],
    ids=["encoder-queue-size", "tokenizer-queue-size", "encoder-queue-timeout"],
)
def test_a_bounded_queue_rejects_the_excess_and_answers_every_request(
    exported, tmp_path_factory, topology, overrides, message
):
    """A stage's queue bound (max_queue_size, queue_timeout_us) rejects what is over it with UNAVAILABLE naming
    the bound; every other request is served, and so is the next one."""
    from model_repository.generate import generate
    from settings import load_settings

    bounded = load_settings(None, [f'ensemble.topology="{topology}"', "encoder.max_queue_delay_us=0", *overrides])
    root = generate(bounded, exported, tmp_path_factory.mktemp("bounded") / "repo")
    server = local_server(bounded, root, tmp_path_factory.mktemp("bounded_server")).start()
    # 32 texts of 200 words per request: each keeps the tokenizer and the encoder busy a while.
    batch = np.array([[" ".join(["overload"] * 200).encode()]] * 32, dtype=object)

    def send(_) -> tuple[str, str]:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            tensor = grpcclient.InferInput("text", list(batch.shape), "BYTES")
            tensor.set_data_from_numpy(batch)
            try:
                client.infer("ensemble", [tensor], client_timeout=120)
                return "ok", ""
            except InferenceServerException as exc:
                return exc.status(), exc.message()

    try:
        with ThreadPoolExecutor(48) as pool:
            outcomes = list(pool.map(send, range(48)))
        with TextClient(server.grpc_url, "grpc") as client:
            assert client.embed(["a good request after the storm"]).shape == (1, 384)
    finally:
        server.stop()
    rejected = [text for status, text in outcomes if status != "ok"]
    assert all(status in ("ok", "StatusCode.UNAVAILABLE") for status, _ in outcomes), outcomes
    assert rejected and len(rejected) < len(outcomes), f"{len(rejected)} of {len(outcomes)} rejected"
    assert all(message in text.lower() for text in rejected), rejected[:3]


def test_the_torch_engine_serves_through_tritonserver_on_the_cpu(
    server, exported, sentences, reference_model, tmp_path_factory
):
    """engine.kind = "torch" without encoder.gpus runs the packed engine in fp32 on the CPU: served by the
    real tritonserver, it gives sentence-transformers' embeddings and the ONNX Runtime server's to fp32 rounding."""
    from model_repository.generate import generate
    from settings import load_settings

    torch_settings = load_settings(None, ['engine.kind="torch"', 'engine.precision="fp32"'])
    assert torch_settings.engine.kind == "torch" and not torch_settings.encoder.gpus
    root = generate(torch_settings, exported, tmp_path_factory.mktemp("torch_repo") / "repo")
    torch_server = local_server(torch_settings, root, tmp_path_factory.mktemp("torch_server")).start()
    try:
        config = grpcclient.InferenceServerClient(torch_server.grpc_url).get_model_config("ensemble", as_json=True)
        assert config["config"]["parameters"]["engine_kind"]["string_value"] == "torch"
        with TextClient(torch_server.grpc_url, "grpc") as client:
            served = client.embed(sentences)
            singles = np.concatenate([client.embed([text]) for text in sentences[:4]])
    finally:
        torch_server.stop()
    with TextClient(server.grpc_url, "grpc") as client:
        onnxruntime_rows = client.embed(sentences)
    np.testing.assert_allclose(served, onnxruntime_rows, atol=2e-6, rtol=0)
    np.testing.assert_allclose(singles, served[:4], atol=2e-6, rtol=0)
    assert cosine(served, reference_model.encode(sentences, convert_to_numpy=True)).min() >= 0.9999
