"""The client's retry policy: which errors are retried, how long it waits (exponential with full jitter, capped),
and that the asyncio client answers as the blocking one does, over both protocols against the real server."""

from __future__ import annotations

import asyncio
import itertools
import random

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client.core import AsyncTextClient, RetryPolicy, TextClient, is_retryable


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


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_async_client_answers_as_the_blocking_one(server, sentences, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    texts = sentences[:5] * 60  # 300 texts: over max_batch_size (256), so sent as two requests and joined
    with TextClient(url, protocol) as client:
        expected = client.embed(texts)

    async def embed() -> np.ndarray:
        async with AsyncTextClient(url, protocol) as client:
            return await client.embed(texts)

    got = asyncio.run(embed())
    assert got.shape == (300, 384)
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
