"""Helpers for the Python stages' custom metrics (copied beside each stage's model.py)."""

from __future__ import annotations


def instance_labels(args: dict) -> dict[str, str]:
    """Triton's own label names (model, version), plus model_instance: each instance is its own stub process."""
    names = {"model": "model_name", "version": "model_version", "model_instance": "model_instance_name"}
    return {label: args[key] for label, key in names.items()}


class StageMetrics:
    """One stage instance's custom metrics, each declared as name -> (description, kind, histogram buckets).

    Metrics are an aid: if Triton refuses to create or update one, all of them turn off with one warning,
    and neither loading the model nor any request fails over it. Each update is one message to the Triton
    process, so stages update per execute() call, never per request."""

    def __init__(self, pb_utils, stage: str, args: dict, declared: dict[str, tuple[str, str, list[float] | None]]):
        self._pb_utils, self._stage = pb_utils, stage
        self._families: list = []
        self._metrics: dict = {}
        try:
            labels = instance_labels(args)
            for name, (description, kind, buckets) in declared.items():
                family = pb_utils.MetricFamily(
                    name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind.upper())
                )
                self._families.append(family)
                extra = {"buckets": buckets} if buckets is not None else {}
                self._metrics[name] = (kind, family.Metric(labels=labels, **extra))
        except Exception as exc:
            self._off(exc)

    def update(self, values: dict[str, float]) -> None:
        """Add each value to its counter, or observe it in its histogram."""
        try:
            for name, value in values.items():
                if name in self._metrics:
                    kind, metric = self._metrics[name]
                    if kind == "histogram":
                        metric.observe(value)
                    else:
                        metric.increment(value)
        except Exception as exc:
            self._off(exc)

    def close(self) -> None:
        """A MetricFamily must outlive its Metrics: drop the metrics first."""
        self._metrics = {}
        self._families = []

    def _off(self, reason: Exception) -> None:
        self._pb_utils.Logger.log_warn(f"{self._stage}: custom metrics off ({reason})")
        self.close()


def power_of_two_buckets(limit: int) -> list[float]:
    """Histogram bucket bounds 1, 2, 4, ... up to the first power of two >= limit."""
    bounds = [1.0]
    while bounds[-1] < limit:
        bounds.append(bounds[-1] * 2)
    return bounds
