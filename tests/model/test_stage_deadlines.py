"""A request whose deadline (the API front's parameter deadline_ns, CLOCK_MONOTONIC) passed while it queued, or, in
turns on a GPU, will pass before its chunk can finish at the stub's best recent pace (stages/deadlines.py), is refused
unrun by the stage, with the words the fronts read as a timeout; the batch's others are served."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from common.contract import BUDGET_EXPIRED, DEADLINE_PARAMETER
from common.gpu_board import GpuBoard
from model_repository.stages.deadlines import Pace
from model_repository.stages.gpu_turns import GpuTurns
from model_repository.stages.stage_core import held
from tests.model.stage_run import engine_runs, request, stage


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
    with engine_runs(core) as runs:
        late, roomy, plain = core.answer(views)
    assert isinstance(late, str) and BUDGET_EXPIRED in late
    assert roomy["embedding"].shape[0] == 2 and plain["embedding"].shape[0] == 1
    assert runs == [3], "the engine ran the two requests with room, 3 texts, and nothing of the late one"


def test_a_request_whose_chunk_cannot_finish_before_its_deadline_is_refused_unrun(core, sentences, tmp_path):
    turns = GpuTurns(GpuBoard(tmp_path / "board"), 0, lane=False, chunk_texts=128, on_gpu=0, yield_s=0.5)
    slow = Pace()
    slow.observe(texts=1, seconds=10.0)  # a slow engine: the chunk below, 4 texts, takes 40 s at the soonest
    slow.observe(texts=2, seconds=30.0)  # a slower chunk does not raise the estimate
    requests = [request(sentences[:1]), request(sentences[1:3]), request(sentences[3:4])]
    requests[0].deadline = time.monotonic() + 5
    requests[1].deadline = time.monotonic() + 60
    pace, core.pace = core.pace, slow
    try:
        with engine_runs(core) as runs:
            hopeless, roomy, plain = core.answer(requests, turns)
    finally:
        core.pace = pace
    assert isinstance(hopeless, str) and hopeless.startswith(BUDGET_EXPIRED) and "could not finish" in hopeless
    assert roomy["embedding"].shape[0] == 2 and plain["embedding"].shape[0] == 1
    assert runs == [3], "the engine ran the 3 texts that can be answered in time"
    assert slow.soonest_s(1) < 10.0, "the chunk that ran taught the stub its pace"


def test_the_pace_is_the_fastest_of_the_recent_chunks_only():
    pace = Pace(window=2)
    assert pace.soonest_s(100) == 0.0, "nothing learned: nothing refused on an estimate"
    pace.observe(texts=10, seconds=0.01)
    pace.observe(texts=10, seconds=0.05)
    assert pace.soonest_s(100) == pytest.approx(0.1)
    pace.observe(texts=10, seconds=0.03)  # the fast chunk leaves the window
    assert pace.soonest_s(100) == pytest.approx(0.3)
    pace.observe(texts=0, seconds=1.0)  # a chunk of refusals alone teaches nothing
    assert pace.soonest_s(100) == pytest.approx(0.3)


def test_a_small_chunk_is_given_at_least_what_small_chunks_took_not_a_large_chunks_share():
    pace = Pace()
    pace.observe(texts=64, seconds=0.002)  # ingestion: 31 us a text
    pace.observe(texts=1, seconds=0.0005)  # a query's chunk of its own
    assert pace.soonest_s(1) == pytest.approx(0.0005), "not 64 texts' share, 31 us"
    assert pace.soonest_s(8) == pytest.approx(0.0005)
    assert pace.soonest_s(64) == pytest.approx(0.002)
    assert pace.soonest_s(128) == pytest.approx(0.004)
    only_large = Pace()
    only_large.observe(texts=64, seconds=0.002)
    assert only_large.soonest_s(1) == pytest.approx(0.002 / 64), "no small chunk seen: its share, never more"
    pace.observe(texts=4, seconds=0.0003)  # the engine got quicker: a slow small chunk no longer holds
    assert pace.soonest_s(1) == pytest.approx(0.0003)


def test_without_turns_a_request_whose_batch_cannot_finish_before_its_deadline_is_refused_unrun(core, sentences):
    """On a CPU, or a GPU with no query lane, the batch is one chunk: the same pace decides."""
    slow = Pace()
    slow.observe(texts=1, seconds=10.0)
    requests = [request(sentences[:1]), request(sentences[1:3])]
    requests[0].deadline = time.monotonic() + 5
    pace, core.pace = core.pace, slow
    try:
        with engine_runs(core) as runs:
            hopeless, plain = core.answer(requests)
    finally:
        core.pace = pace
    assert isinstance(hopeless, str) and "could not finish" in hopeless
    assert plain["embedding"].shape[0] == 2 and runs == [2]
