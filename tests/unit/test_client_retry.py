"""The client's retry policy: which errors are retried and how long it waits (exponential with full jitter, capped)."""

from __future__ import annotations

import itertools
import random

import pytest
from tritonclient.utils import InferenceServerException

from client.core import RetryPolicy, is_retryable


def test_delays_grow_exponentially_with_full_jitter_up_to_the_cap():
    random.seed(0)
    policy = RetryPolicy(attempts=8, base_delay_s=0.05, max_delay_s=1.0)
    samples = [list(policy.delays()) for _ in range(2000)]
    assert {len(s) for s in samples} == {7}, "attempts counts the first try: 7 waits between 8 tries"
    caps = [min(1.0, 0.05 * 2**attempt) for attempt in range(7)]  # 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0
    for attempt, cap in enumerate(caps):
        waits = [s[attempt] for s in samples]
        assert 0 <= min(waits) < 0.05 * cap and 0.95 * cap < max(waits) <= cap, (attempt, min(waits), max(waits))
        assert abs(sum(waits) / len(waits) - cap / 2) < 0.05 * cap, "full jitter: uniform over [0, cap]"


def test_without_an_attempt_limit_the_waits_go_on_capped():
    waits = list(itertools.islice(RetryPolicy(max_delay_s=0.3).delays(), 200))
    assert len(waits) == 200 and max(waits) <= 0.3
    assert list(RetryPolicy(attempts=1).delays()) == [], "one attempt: no retry at all"


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (InferenceServerException("unavailable", status="StatusCode.UNAVAILABLE"), True),
        (InferenceServerException("Service Unavailable", status="503"), True),  # the HTTP front while Triton restarts
        (InferenceServerException("Request for model 'ensemble' is not healthy", status="StatusCode.INTERNAL"), True),
        (InferenceServerException("'ensemble' has no available versions", status="StatusCode.UNAVAILABLE"), True),
        (InferenceServerException("failed to connect to all addresses", status="StatusCode.UNAVAILABLE"), True),
        (InferenceServerException("Cancelled", status="StatusCode.CANCELLED"), True),  # a server stopping mid-call
        (ConnectionRefusedError(111, "Connection refused"), True),
        (TimeoutError(), True),
        (
            InferenceServerException("text[0] is 2000000 bytes, over the limit", status="StatusCode.INVALID_ARGUMENT"),
            False,
        ),
        (InferenceServerException("Request for unknown model: 'nope' is not found", status="400"), False),
        (ValueError("no texts to send"), False),
    ],
)
def test_only_transient_errors_are_retried(error, retried):
    assert is_retryable(error) is retried
