"""The stages' custom metrics in the stub: they never fail the model, and histograms go out as Prometheus reads them."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest

from model_repository.stages import stage_metrics


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
