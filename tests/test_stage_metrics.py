"""The stages' custom metrics: on the metrics port within a flush, never failing the model, histograms as
Prometheus reads them."""

from __future__ import annotations

import importlib.util
import re
import sys
import time
import types

import numpy as np
import pytest

from client import TextClient
from common.hf_tokenizer import load_tokenizer
from model_repository.stages import stage_metrics
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
    tokenizer = load_tokenizer(exported / "tokenizer.json", settings.model.max_tokens)
    tokens = sum(len(tokenizer.encode(text).ids) for text in texts)
    time.sleep(2 * FLUSH_INTERVAL_S)  # what earlier requests (the warm-up, other tests) counted is sent by now
    before = scrape(server.host, server.ports.metrics)
    with TextClient(server.grpc_url, "grpc") as client:
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
    labels = re.search(r"^bert_encoder_real_tokens_total{(.*)}", after, flags=re.M).group(1)
    assert f'model_instance="{encoding}_0_0"' in labels
    # Buckets by powers of two up to the model's max_batch_size, cumulative, as a Prometheus histogram's.
    bounds = re.findall(rf'^bert_encoder_sequences_per_execute_bucket{{.*le="([^"]+)".*model="{encoding}"', after, re.M)
    limit = settings.ensemble.max_batch_size if one_stage else settings.encoder.max_batch_size
    assert sorted(bounds, key=lambda b: float(b)) == [str(2**i) for i in range(limit.bit_length())] + ["+Inf"]


class FailingMetrics:
    """A triton_python_backend_utils stand-in whose metrics fail: at creation, or at the first update."""

    def __init__(self, fail_on: str) -> None:
        self.warnings: list[str] = []
        self.Logger = types.SimpleNamespace(log_warn=self.warnings.append)
        fail_on_create = fail_on == "create"

        class Metric:
            def increment(self, value):
                raise RuntimeError("metric update failed")

            observe = increment

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

            def __init__(self, name, description, kind):
                if fail_on_create:
                    raise RuntimeError("custom metrics are not available")

            def Metric(self, labels, buckets=None):  # the Python backend's name
                return Metric()

        self.MetricFamily = MetricFamily


@pytest.mark.parametrize("fail_on", ["create", "update"])
@pytest.mark.parametrize("stage", ["pipeline_model", "tokenizer_model", "encoder_model"])
def test_stage_metrics_never_fail_the_model(monkeypatch, stage, fail_on):
    fake = FailingMetrics(fail_on)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    module = importlib.import_module(f"model_repository.stages.{stage}")
    monkeypatch.setattr(module, "pb_utils", fake)  # the module may be imported already, bound to another fake
    model = module.TritonPythonModel()
    args = {"model_name": stage, "model_version": "1", "model_instance_name": f"{stage}_0_0"}
    model.engine = types.SimpleNamespace(computed_tokens=24)
    model._create_metrics(args, 8)
    if stage == "encoder_model":
        model._record(2, 17)
        model._record(1, 5)
    else:
        model._record(2, np.array([9, 8]))
        model._record(1, np.array([], dtype=np.int64))
    model._metrics.flush()  # what the thread does each second: the failing update turns the metrics off, once
    model._metrics.flush()
    model.finalize()
    assert len(fake.warnings) == 1 and "custom metrics off" in fake.warnings[0]


def test_stage_metrics_send_histograms_as_cumulative_counters(monkeypatch):
    """Counts wait in the stub and go out in one flush: buckets cumulative, as Prometheus reads histograms."""
    sent: dict = {}

    class Metric:
        def __init__(self, key):
            self.key = key

        def increment(self, value):
            sent[self.key] = sent.get(self.key, 0) + value

    class Family:
        COUNTER = 0

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels):  # the Python backend's name
            return Metric((self.name, labels.get("le")))

    fake = types.SimpleNamespace(MetricFamily=Family, Logger=types.SimpleNamespace(log_warn=print))
    args = {"model_name": "m", "model_version": "1", "model_instance_name": "m_0_0"}
    declared = {"texts": ("t", "histogram", [1.0, 2.0, 4.0]), "requests": ("r", "counter", None)}
    metrics = stage_metrics.StageMetrics(fake, "m", args, declared, interval_s=3600)
    for value in (1, 3, 3, 9):
        metrics.add({"texts": value, "requests": 2})
    assert sent == {}, "nothing is sent per add()"
    metrics.flush()
    metrics.close()
    buckets = {le: value for (name, le), value in sent.items() if name == "texts_bucket"}
    assert buckets == {"1": 1, "2": 1, "4": 3, "+Inf": 4}, "cumulative, as Prometheus reads a histogram"
    assert sent[("texts_sum", None)] == 16 and sent[("texts_count", None)] == 4 and sent[("requests", None)] == 8
    assert stage_metrics.power_of_two_buckets(8) == [1, 2, 4, 8]
    assert stage_metrics.power_of_two_buckets(1000)[-1] == 1024.0
