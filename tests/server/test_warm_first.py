"""encoder.warm_first on the real tritonserver: requests that arrive one at a time all go to the first instance,
where Triton alone hands each to the instance that has been idle longest (a cold stub, on a GPU another CUDA
context). Counted per instance by the stage's own metrics."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from client import TextClient
from model_repository.generate import generate
from model_repository.stages.stage_metrics import FLUSH_INTERVAL_S
from serving.launcher.harness import local_server
from tests.support import scrape

LONE_REQUESTS = 40
# Between them: Triton frees an instance for the rate limiter after its responses are sent, so a request sent
# back to back can find the first instance still taken (CI on 2 cores once saw 38 / 2 without the pause).
PAUSE_S = 0.05


def requests_by_instance(server) -> dict[str, float]:
    """bert_tokenizer_requests_total of each instance, once every stub has sent its counts (about once a second)."""
    time.sleep(3 * FLUSH_INTERVAL_S)
    text = scrape(server.host, server.ports.metrics)
    found = re.findall(r"^bert_tokenizer_requests_total{([^}]*)} (\S+)$", text, flags=re.M)
    return {
        re.search(r'model_instance="([^"]+)"', labels).group(1): float(value)
        for labels, value in found
        if 'model="ensemble"' in labels  # not its query lane's instance
    }


def served_by_instance(settings, exported, work, warm_first: bool) -> list[float]:
    """Requests per instance (in instance order) of a two-instance ensemble, of LONE_REQUESTS sent one after
    another; the warm-up's are not counted."""
    encoder = dataclasses.replace(settings.encoder, instances=2, warm_first=warm_first)
    two = dataclasses.replace(settings, encoder=encoder)
    server = local_server(two, generate(two, exported, work / "repository"), work).start()
    try:
        before = requests_by_instance(server)
        with TextClient(server.grpc_url, "grpc", priority="ingestion") as client:  # the model, not its lane
            for index in range(LONE_REQUESTS):
                client.embed([f"Lone request number {index} arrives while both instances are free."])
                time.sleep(PAUSE_S)
        after = requests_by_instance(server)
    finally:
        server.stop()
    assert len(after) == 2, after
    return [after[instance] - before.get(instance, 0) for instance in sorted(after)]


@pytest.mark.parametrize("warm_first", [True, False])
def test_lone_requests_go_to_the_first_instance_with_warm_first(settings, exported, tmp_path, warm_first):
    counts = served_by_instance(settings, exported, tmp_path, warm_first)
    first, second = counts
    assert first + second == LONE_REQUESTS, counts
    if warm_first:  # the rate limiter picks the free instance with the fewest executions x priority (1 vs 1000)
        assert second <= 1, counts
    else:  # Triton's own order: the longest idle instance, so the two take turns
        assert min(first, second) >= LONE_REQUESTS / 4, counts
