"""A request whose deadline (the API front's parameter deadline_ns, CLOCK_MONOTONIC) passed while it queued is
refused unrun by the stage, with the words the fronts read as a timeout; the batch's others are served."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from common.contract import BUDGET_EXPIRED, DEADLINE_PARAMETER
from model_repository.stages.stage_core import held
from tests.model.stage_run import stage


class Request:
    """What held() reads of a Python-backend request."""

    def __init__(self, texts: list[str], parameters: dict) -> None:
        self.text = np.array([[text.encode()] for text in texts], dtype=np.object_)
        self._parameters = json.dumps(parameters)

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return []


class Tensor:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def as_numpy(self) -> np.ndarray:
        return self.array


@pytest.fixture(scope="module")
def core(exported):
    return stage(exported)


def test_a_request_past_its_deadline_is_refused_unrun_and_the_others_are_served(core, sentences):
    now = time.monotonic_ns()
    requests = [
        Request(sentences[:2], {DEADLINE_PARAMETER: now - 1_000_000}),
        Request(sentences[2:4], {DEADLINE_PARAMETER: now + 30_000_000_000}),
        Request(sentences[4:5], {}),
    ]
    views = [held(request, False, lambda request, name: Tensor(request.text)) for request in requests]
    runs = []
    record = core.record
    core.record = lambda count, lengths, computed=None: runs.append(len(lengths))
    try:
        late, roomy, plain = core.answer(views)
    finally:
        core.record = record
    assert isinstance(late, str) and BUDGET_EXPIRED in late
    assert roomy["embedding"].shape[0] == 2 and plain["embedding"].shape[0] == 1
    assert runs == [3], "the engine ran the two requests with room, 3 texts, and nothing of the late one"
