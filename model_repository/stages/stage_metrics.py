"""Helpers for the Python stages' custom metrics (copied beside each stage's model.py)."""

from __future__ import annotations


def instance_labels(args: dict) -> dict[str, str]:
    """Triton's own label names (model, version), plus model_instance: each instance is its own stub process."""
    names = {"model": "model_name", "version": "model_version", "model_instance": "model_instance_name"}
    return {label: args[key] for label, key in names.items()}


class NoMetric:
    """Stands in for the metrics when Triton refuses them (custom metrics are an aid, not a requirement)."""

    def increment(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


NO_METRIC = NoMetric()


def power_of_two_buckets(limit: int) -> list[float]:
    """Histogram bucket bounds 1, 2, 4, ... up to the first power of two >= limit."""
    bounds = [1.0]
    while bounds[-1] < limit:
        bounds.append(bounds[-1] * 2)
    return bounds
