"""The Python stages' custom metrics (copied beside each stage's model.py), kept off the request path.

Each metric update is a message from the stub to the Triton process (it cost 10-12 % of a stub's time when
every execute() sent three). So the stages only add to counts held in the stub, and a thread sends what
accumulated about once a second (FLUSH_INTERVAL_S). At unload the thread stops and nothing more is sent:
the model's metrics go with it, and a stub still sending while Triton tears down made tritonserver 2.51
abort on a corrupted heap at its exit timeout.

A histogram is kept the same way, as the counters Prometheus reads a histogram from: <name>_bucket{le=...}
(cumulative, up to le="+Inf"), <name>_sum and <name>_count, so histogram_quantile() works on it as on any
histogram; Triton's own histogram type takes one message per observed value.
"""

from __future__ import annotations

import bisect
import threading

FLUSH_INTERVAL_S = 1.0


def instance_labels(args: dict) -> dict[str, str]:
    """Triton's own label names (model, version), plus model_instance: each instance is its own stub process."""
    names = {"model": "model_name", "version": "model_version", "model_instance": "model_instance_name"}
    return {label: args[key] for label, key in names.items()}


def _bound_label(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class StageMetrics:
    """One stage instance's custom metrics, each declared as name -> (description, kind, histogram buckets).

    Metrics are an aid: if Triton refuses to create or update one, all of them turn off with one warning,
    and neither loading the model nor any request fails over it."""

    def __init__(
        self,
        pb_utils,
        stage: str,
        args: dict,
        declared: dict[str, tuple[str, str, list[float] | None]],
        interval_s: float = FLUSH_INTERVAL_S,
    ):
        self._pb_utils, self._stage = pb_utils, stage
        self._families: list = []
        self._counters: dict = {}  # series name -> Triton counter
        self._bounds: dict[str, list[float]] = {}  # histogram name -> bucket bounds
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            labels = instance_labels(args)
            for name, (description, kind, buckets) in declared.items():
                if kind == "histogram":
                    self._bounds[name] = sorted(buckets)
                    bucket_family = self._family(f"{name}_bucket", description + " (histogram buckets)")
                    for bound in [*self._bounds[name], "+Inf"]:
                        le = bound if bound == "+Inf" else _bound_label(bound)
                        self._counters[f"{name}_bucket/{le}"] = bucket_family.Metric(labels={**labels, "le": le})
                    for suffix in ("sum", "count"):
                        family = self._family(f"{name}_{suffix}", f"{description} (histogram {suffix})")
                        self._counters[f"{name}_{suffix}"] = family.Metric(labels=labels)
                else:
                    self._counters[name] = self._family(name, description).Metric(labels=labels)
        except Exception as exc:
            self._off(exc)
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name=f"{stage}-metrics", daemon=True)
        self._thread.start()

    def _family(self, name: str, description: str):
        family = self._pb_utils.MetricFamily(
            name=name, description=description, kind=self._pb_utils.MetricFamily.COUNTER
        )
        self._families.append(family)
        return family

    def add(self, values: dict[str, float]) -> None:
        """Add each value to its counter, or count it in its histogram; no message to Triton."""
        with self._lock:
            pending = self._pending
            for name, value in values.items():
                bounds = self._bounds.get(name)
                if bounds is None:
                    pending[name] = pending.get(name, 0) + value
                    continue
                key = f"{name}/{bisect.bisect_left(bounds, value)}"  # the first bucket whose bound holds value
                pending[key] = pending.get(key, 0) + 1
                pending[f"{name}_sum"] = pending.get(f"{name}_sum", 0) + value
                pending[f"{name}_count"] = pending.get(f"{name}_count", 0) + 1

    def flush(self) -> None:
        """Send what accumulated since the last flush: one message per series that changed."""
        with self._lock:
            pending, self._pending = self._pending, {}
        try:
            for name, bounds in self._bounds.items():
                running = 0
                for index, bound in enumerate([*bounds, "+Inf"]):
                    running += pending.pop(f"{name}/{index}", 0)
                    if running:
                        le = bound if bound == "+Inf" else _bound_label(bound)
                        self._counters[f"{name}_bucket/{le}"].increment(running)
            for name, value in pending.items():
                if value and name in self._counters:
                    self._counters[name].increment(value)
        except Exception as exc:
            self._off(exc)

    def close(self) -> None:
        """Stop the thread (after a flush it is in), then drop the metrics before their families (a MetricFamily
        must outlive them). What was counted in the last second is not sent: the model is unloading."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._counters = {}
        self._families = []

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.flush()

    def _off(self, reason: Exception) -> None:
        self._pb_utils.Logger.log_warn(f"{self._stage}: custom metrics off ({reason})")
        self._counters = {}
        self._bounds = {}
        self._families = []


def tokenizer_metrics(max_batch_size: int) -> dict[str, tuple[str, str, list[float] | None]]:
    """What tokenizing stages count: the tokenizer's (two-stage) and the pipeline's (one-stage)."""
    return {
        "bert_tokenizer_requests_total": ("Requests tokenized", "counter", None),
        "bert_tokenizer_tokens_total": ("Tokens produced after truncation, special tokens included", "counter", None),
        "bert_tokenizer_texts_per_execute": (
            "Texts encoded per execute() call",
            "histogram",
            power_of_two_buckets(max_batch_size),
        ),
    }


def encoder_metrics(max_batch_size: int) -> dict[str, tuple[str, str, list[float] | None]]:
    """What encoding stages count: the encoder's (two-stage) and the pipeline's (one-stage)."""
    return {
        "bert_encoder_sequences_per_execute": (
            "Sequences per execute() call (the engine's batch size)",
            "histogram",
            power_of_two_buckets(max_batch_size),
        ),
        "bert_encoder_real_tokens_total": ("Tokens of the encoded sequences", "counter", None),
        "bert_encoder_padded_tokens_total": ("Tokens the engine computed, its padding included", "counter", None),
    }


def deadline_metrics() -> dict[str, tuple[str, str, list[float] | None]]:
    """What the one-stage model counts of the requests it refuses unrun, their deadline (deadline_ns) past."""
    return {"bert_requests_expired_total": ("Requests refused unrun: their deadline had passed", "counter", None)}


def tokenizer_counts(requests: int, lengths) -> dict[str, float]:
    """What one tokenizing execute() adds to tokenizer_metrics: its requests, and the tokens of its texts."""
    values = {"bert_tokenizer_requests_total": requests}
    if len(lengths):
        values["bert_tokenizer_tokens_total"] = int(lengths.sum())
        values["bert_tokenizer_texts_per_execute"] = len(lengths)
    return values


def encoder_counts(sequences: int, real_tokens: int, computed_tokens: int) -> dict[str, float]:
    """What one engine call adds to encoder_metrics."""
    return {
        "bert_encoder_sequences_per_execute": sequences,
        "bert_encoder_real_tokens_total": real_tokens,
        "bert_encoder_padded_tokens_total": computed_tokens,
    }


def power_of_two_buckets(limit: int) -> list[float]:
    """Histogram bucket bounds 1, 2, 4, ... up to the first power of two >= limit."""
    bounds = [1.0]
    while bounds[-1] < limit:
        bounds.append(bounds[-1] * 2)
    return bounds
