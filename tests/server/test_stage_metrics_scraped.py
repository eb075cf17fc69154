"""The stages' custom metrics on the real tritonserver's metrics port, within a flush, in both topologies."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client import TextClient
from common.contract import BUDGET_EXPIRED, DEADLINE_PARAMETER, TEXT_INPUT
from common.hf_tokenizer import load_tokenizer
from model_repository.stages.stage_metrics import FLUSH_INTERVAL_S
from tests.support import (
    samples,
    scrape,
)


# ---------------------------------------------------------------------------------------------------------
# Stage metrics: counted in the stub, sent by a thread, never failing the model
# ---------------------------------------------------------------------------------------------------------
def test_stage_metrics_on_the_metrics_port(topology_server, exported, settings):
    """The stages' counts reach the metrics port within about a second (stage_metrics.FLUSH_INTERVAL_S), under
    the same names in both topologies, labelled with the model that counted them."""
    server = topology_server
    one_stage = server.settings.topology == "one_stage"
    tokenizing, encoding = ("ensemble", "ensemble") if one_stage else ("tokenizer", "encoder")
    texts = ["Triton batches requests dynamically.", "A second, somewhat longer text about tokenization.", "ok"]
    tokenizer = load_tokenizer(exported / "tokenizer.json", settings.max_tokens(exported))
    tokens = sum(len(tokenizer.encode(text).ids) for text in texts)
    time.sleep(2 * FLUSH_INTERVAL_S)  # what earlier requests (the warm-up, other tests) counted is sent by now
    before = scrape(server.host, server.ports.metrics)
    with TextClient(server.grpc_url, "grpc", priority="ingestion") as client:  # the model, not its lane
        client.embed(texts)  # one request, three texts

    def delta(name, **labels):
        return samples(after, name, **labels) - samples(before, name, **labels)

    deadline = time.monotonic() + 5 * FLUSH_INTERVAL_S
    while True:
        after = scrape(server.host, server.ports.metrics)
        # Each stub flushes on its own clock: in two stages the tokenizer's and the encoder's counts come apart.
        flushed = delta("bert_tokenizer_requests_total", model=tokenizing) and delta(
            "bert_encoder_padded_tokens_total", model=encoding
        )
        if flushed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert delta("bert_tokenizer_requests_total", model=tokenizing, version="1") == 1
    assert delta("bert_tokenizer_tokens_total", model=tokenizing) == tokens
    assert delta("bert_tokenizer_texts_per_execute_count", model=tokenizing) == 1
    assert delta("bert_tokenizer_texts_per_execute_sum", model=tokenizing) == len(texts)
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="2") == 0
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="4") == 1
    assert delta("bert_tokenizer_texts_per_execute_bucket", model=tokenizing, le="+Inf") == 1
    assert delta("bert_encoder_sequences_per_execute_sum", model=encoding) == len(texts)
    assert delta("bert_encoder_real_tokens_total", model=encoding) == tokens
    # onnxruntime_cpu pads each chunk to its longest sequence: computed tokens >= real ones.
    padded = delta("bert_encoder_padded_tokens_total", model=encoding)
    assert tokens <= padded <= len(texts) * max(len(tokenizer.encode(t).ids) for t in texts)
    # The model's own series: the query lane's (ensemble-query) may come first in the page.
    labels = re.search(rf'^bert_encoder_real_tokens_total{{(.*model="{encoding}".*)}}', after, flags=re.M).group(1)
    assert f'model_instance="{encoding}_0_0"' in labels
    # Buckets by powers of two up to the model's max_batch_size, cumulative, as a Prometheus histogram's.
    bounds = re.findall(rf'^bert_encoder_sequences_per_execute_bucket{{.*le="([^"]+)".*model="{encoding}"', after, re.M)
    limit = settings.ensemble.max_batch_size if one_stage else settings.encoder.max_batch_size
    assert sorted(bounds, key=lambda b: float(b)) == [str(2**i) for i in range(limit.bit_length())] + ["+Inf"]


def test_a_request_refused_past_its_deadline_is_counted_and_not_encoded(server):
    """The one-stage model counts each request it refuses unrun, its deadline (deadline_ns) past: what
    bench/priority_bench.py reads to tell "none ran" (Triton's own nv_inference_count counts it as an inference)."""
    time.sleep(2 * FLUSH_INTERVAL_S)
    before = scrape(server.host, server.ports.metrics)
    text = grpcclient.InferInput(TEXT_INPUT, [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"too late"]], dtype=np.object_))
    with (
        grpcclient.InferenceServerClient(server.grpc_url) as client,
        pytest.raises(InferenceServerException, match=BUDGET_EXPIRED),
    ):
        client.infer("ensemble", [text], parameters={DEADLINE_PARAMETER: time.monotonic_ns() - 1_000_000})

    def delta(name: str) -> float:
        return samples(after, name, model="ensemble") - samples(before, name, model="ensemble")

    deadline = time.monotonic() + 5 * FLUSH_INTERVAL_S
    while True:
        after = scrape(server.host, server.ports.metrics)
        if delta("bert_requests_expired_total") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert delta("bert_requests_expired_total") == 1
    assert delta("bert_encoder_sequences_per_execute_sum") == 0 and delta("bert_tokenizer_requests_total") == 0
