"""The pass/fail bar: thresholds, the verdict on a run's numbers, the knee of a step ramp.

No Locust import here (importing locust monkey-patches the process with gevent), so the runner, the
locustfile and the tests share this module.
"""

from __future__ import annotations

import dataclasses
import re

from settings.schema import LoadTestSettings

LOAD_MODELS = ("closed", "throughput", "ramp")
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)")


@dataclasses.dataclass(frozen=True)
class Thresholds:
    p50_ms: float
    p99_ms: float
    min_rps: float
    max_fail_ratio: float

    @classmethod
    def resolve(cls, load: LoadTestSettings, **overrides: float | None) -> Thresholds:
        """The settings' bar, with every override that is not None in its place."""
        values = {f.name: getattr(load, f.name) for f in dataclasses.fields(cls)}
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Measured:
    """What a run (or one step of a ramp) delivered, as the load generator saw it."""

    requests: int
    failures: int
    rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float = 0.0

    @property
    def fail_ratio(self) -> float:
        return self.failures / self.requests if self.requests else 1.0


def breaches(bar: Thresholds, run: Measured) -> list[str]:
    """Every threshold the run broke, as short phrases; empty when it passed."""
    if run.requests == 0:
        return ["no request completed"]
    reasons = []
    if run.fail_ratio > bar.max_fail_ratio:
        reasons.append(f"fail ratio {run.fail_ratio:.4f} > {bar.max_fail_ratio:g} ({run.failures} failed)")
    if run.p99_ms > bar.p99_ms:
        reasons.append(f"p99 {run.p99_ms:g} ms > {bar.p99_ms:g} ms")
    if run.p50_ms > bar.p50_ms:
        reasons.append(f"p50 {run.p50_ms:g} ms > {bar.p50_ms:g} ms")
    if run.rps < bar.min_rps:
        reasons.append(f"{run.rps:.1f} req/s < {bar.min_rps:g} req/s")
    return reasons


def verdict_line(reasons: list[str], run: Measured, load_model: str) -> str:
    """The one line an operator reads: ACCEPTED or REJECTED, why, and the numbers."""
    numbers = (
        f"{run.rps:.1f} req/s, p50 {run.p50_ms:g} ms, p99 {run.p99_ms:g} ms, "
        f"{run.failures}/{run.requests} failed ({load_model})"
    )
    if reasons:
        return f"REJECTED: {'; '.join(reasons)} [{numbers}]"
    return f"ACCEPTED: {numbers}"


def find_knee(steps: list[dict], min_scaling: float = 0.5) -> int | None:
    """Index of the knee of a step ramp: the last step before throughput stopped following the users.

    A step "scales" when its relative throughput gain is at least `min_scaling` times its relative user
    gain (1.0 would be perfectly linear, as an unsaturated closed loop is). The knee is the step before
    the first one that does not scale; None while every step still scales (no knee within the ramp).
    """
    for index in range(1, len(steps)):
        before, step = steps[index - 1], steps[index]
        if before["rps"] <= 0 or before["users"] <= 0 or step["users"] <= before["users"]:
            continue
        user_gain = step["users"] / before["users"] - 1
        rps_gain = step["rps"] / before["rps"] - 1
        if rps_gain < min_scaling * user_gain:
            return index - 1
    return None


def best_step(bar: Thresholds, steps: list[dict]) -> int | None:
    """Index of the step with the highest throughput among those within the latency and failure bar."""
    within = [
        i
        for i, s in enumerate(steps)
        if s["requests"] > 0
        and s["p99_ms"] <= bar.p99_ms
        and s["p50_ms"] <= bar.p50_ms
        and s["failures"] / s["requests"] <= bar.max_fail_ratio
    ]
    return max(within, key=lambda i: steps[i]["rps"]) if within else None


def ramp_breaches(bar: Thresholds, steps: list[dict], total: Measured) -> list[str]:
    """A ramp passes when some step met the latency bar at >= min_rps and the run's failures stayed in bounds."""
    if not steps:
        return ["the ramp completed no step"]
    reasons = []
    if total.fail_ratio > bar.max_fail_ratio:
        reasons.append(f"fail ratio {total.fail_ratio:.4f} > {bar.max_fail_ratio:g} ({total.failures} failed)")
    best = best_step(bar, steps)
    if best is None:
        reasons.append(f"no step kept p99 <= {bar.p99_ms:g} ms and p50 <= {bar.p50_ms:g} ms")
    elif steps[best]["rps"] < bar.min_rps:
        step = steps[best]
        reasons.append(
            f"best step within the latency bar ({step['users']} users) gave {step['rps']:.1f} req/s "
            f"< {bar.min_rps:g} req/s"
        )
    return reasons


def parse_mix(text: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """ "1:3,8:1" -> sizes (1, 8), weights (3.0, 1.0): 3 single-text requests for each batch of 8."""
    sizes, weights = [], []
    for item in filter(None, (part.strip() for part in text.split(","))):
        size, _, weight = item.partition(":")
        sizes.append(int(size))
        weights.append(float(weight or 1))
    if not sizes or min(sizes) < 1 or min(weights) <= 0:
        raise ValueError(f"bad batch mix {text!r}: want SIZE[:WEIGHT],... with sizes >= 1 and weights > 0")
    return tuple(sizes), tuple(weights)


def format_mix(sizes, weights) -> str:
    return ",".join(f"{s}:{w:g}" for s, w in zip(sizes, weights, strict=True))


def parse_duration(text: str | float) -> float:
    """ "30s", "2m", "1h30m" or plain seconds -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    text = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _SPAN.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text.replace(" ", ""):
        raise ValueError(f"bad duration {text!r}: use e.g. 30s, 2m, 1h30m")
    return sum(float(value) * {"h": 3600, "m": 60, "s": 1}[unit] for value, unit in parts)
