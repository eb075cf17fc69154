"""The stubs' turns on a GPU (model_repository/stages/gpu_turns.py, common/gpu_board.py): a batch holding ingestion
runs in chunks of whole requests with the same answers as at once, each chunk waits while another process holds a
query on its GPU (for at most the yield), a batch of queries is neither marked nor cut, and the board forgets what a
dead process marked. The stage core runs in this process on the CPU engine; the board is the real shared file."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from common.gpu_board import BOARD_ENVIRONMENT, INGESTING, ON_GPU, QUERYING, GpuBoard
from model_repository.stages.gpu_turns import GpuTurns, turns_for_stub
from tests.model.stage_run import engine_runs, request, stage

QUERY = {"lane": "query"}


@pytest.fixture(scope="module")
def core(exported):
    return stage(exported)


@pytest.fixture
def board_path(tmp_path):
    return tmp_path / "board"


def hold_query(path, seconds: float) -> subprocess.Popen:
    """Another process (a lane's stub) holding a query on GPU 0 for `seconds`, then letting it go."""
    code = (
        "import sys, time; from common.gpu_board import GpuBoard, QUERYING; "
        f"b = GpuBoard({str(path)!r}).claim(0); b.mark(QUERYING); print('held', flush=True); "
        f"time.sleep({seconds}); b.mark(0); time.sleep(5)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_ingestion_runs_in_chunks_of_whole_requests_with_the_answers_of_one_batch(core, board_path, sentences):
    requests = [request(sentences[i : i + size]) for i, size in enumerate((3, 1, 4, 2, 5))]
    turns = GpuTurns(GpuBoard(board_path), 0, lane=False, chunk_texts=5, on_gpu=2, yield_s=0.5)
    turns.ingesting = True
    assert [[r.rows for r in chunk] for chunk in turns.chunks(requests)] == [[3, 1], [4], [2], [5]]
    at_once = core.answer(requests)
    in_turns = core.answer(requests, turns)
    for whole, chunked in zip(at_once, in_turns, strict=True):
        np.testing.assert_allclose(chunked["embedding"], whole["embedding"], atol=1e-6)
        assert (chunked["tokens"] == whole["tokens"]).all()
    assert GpuBoard(board_path).ingesting(), "ingestion was stamped on the board"
    assert GpuBoard(board_path).count(INGESTING | ON_GPU, 0) == 0, "nothing stays marked after the batch"


def test_a_batch_of_queries_is_neither_marked_nor_cut(core, board_path, sentences):
    turns = GpuTurns(GpuBoard(board_path), 0, lane=False, chunk_texts=1, on_gpu=1, yield_s=0.5)
    requests = [request(sentences[:2], QUERY), request(sentences[2:3], QUERY)]
    turns.begin(requests)
    assert not turns.ingesting and turns.chunks(requests) == [requests]
    turns.end()
    assert not GpuBoard(board_path).ingesting()


def test_an_ingestion_chunk_waits_while_a_query_is_held_on_its_gpu(core, board_path, sentences):
    turns = GpuTurns(GpuBoard(board_path), 0, lane=False, chunk_texts=128, on_gpu=0, yield_s=2.0)
    holder = hold_query(board_path, 0.3)
    try:
        started = time.perf_counter()
        (answer,) = core.answer([request(sentences[:4])], turns)
        waited = time.perf_counter() - started
    finally:
        holder.kill()
        holder.wait()
    assert "embedding" in answer
    assert 0.25 < waited < 1.5, f"the chunk waited {waited:.3f} s for a query held 0.3 s"


def test_a_query_held_too_long_delays_ingestion_by_the_yield_only(core, board_path, sentences):
    turns = GpuTurns(GpuBoard(board_path), 0, lane=False, chunk_texts=128, on_gpu=0, yield_s=0.2)
    holder = hold_query(board_path, 30)
    other_gpu = GpuTurns(GpuBoard(board_path), 1, lane=False, chunk_texts=128, on_gpu=0, yield_s=5.0)
    try:
        started = time.perf_counter()
        core.answer([request(sentences[:4])], turns)
        waited = time.perf_counter() - started
        started = time.perf_counter()
        core.answer([request(sentences[:4])], other_gpu)
        elsewhere = time.perf_counter() - started
    finally:
        holder.kill()
        holder.wait()
    assert 0.18 < waited < 1.0, f"waited {waited:.3f} s against a yield of 0.2 s"
    assert elsewhere < 1.0, "a query on GPU 0 holds back no chunk on GPU 1"


def test_the_lane_marks_its_queries_and_a_dead_stubs_marks_are_forgotten(board_path):
    lane = GpuTurns(GpuBoard(board_path), 0, lane=True, chunk_texts=128, on_gpu=2, yield_s=0.2)
    reader = GpuBoard(board_path)
    lane.begin([request(["a query"])])
    assert reader.count(QUERYING, 0) == 1 and reader.count(QUERYING, 1) == 0
    lane.end()
    assert reader.count(QUERYING, 0) == 0
    holder = hold_query(board_path, 30)
    assert reader.count(QUERYING, 0) == 1
    holder.kill()
    holder.wait()
    assert reader.count(QUERYING, 0) == 1, "a dead process's mark stays until a slot is claimed"
    GpuBoard(board_path).claim(0)
    assert reader.count(QUERYING, 0) == 0


def test_a_request_whose_deadline_passes_before_its_chunk_runs_is_refused_unrun(core, board_path, sentences):
    """In the first chunk, tokenized in time, its deadline passes while the chunk waits its turn; in the second, while
    the first one waits and runs. Neither runs; the others are served."""
    turns = GpuTurns(GpuBoard(board_path), 0, lane=False, chunk_texts=3, on_gpu=0, yield_s=0.5)
    holder = hold_query(board_path, 0.3)  # the first chunk waits its turn behind a held query, the second after it
    try:
        soon = time.monotonic() + 0.15
        requests = [request(sentences[:2]), request(sentences[2:3]), request(sentences[3:5]), request(sentences[5:6])]
        requests[1].deadline = soon  # chunk 1: 2 + 1 texts
        requests[2].deadline = soon  # chunk 2: 2 + 1 texts
        with engine_runs(core) as runs:
            answers = core.answer(requests, turns)
    finally:
        holder.kill()
        holder.wait()
    assert [isinstance(answer, str) for answer in answers] == [False, True, True, False]
    assert all("time budget ran out" in answer for answer in answers[1:3])
    assert answers[0]["embedding"].shape[0] == 2 and answers[3]["embedding"].shape[0] == 1
    assert runs == [2, 1], "the engine ran the texts of the requests still in time only"


def test_a_stub_whose_engine_puts_queries_first_cuts_its_chunks_but_never_waits(core, board_path, sentences,
                                                                                  monkeypatch):  # fmt: skip
    """The engine process runs the lane's calls first itself: its stubs' chunks run beside a held query at once, the
    settings' waits are for stubs with an engine of their own, and a CPU instance or a server without a board takes
    no turns."""
    monkeypatch.setenv(BOARD_ENVIRONMENT, str(board_path))
    args = {"model_instance_kind": "GPU", "model_instance_device_id": "0"}
    params = {"gpu_turns": "model", "ingestion_chunk_texts": "2", "ingestion_on_gpu": "1", "query_yield_ms": "2000"}
    own, shared = turns_for_stub(args, params, False), turns_for_stub(args, params, True)
    assert (own.on_gpu, own.yield_s, own.chunk_texts) == (1, 2.0, 2)
    assert (shared.on_gpu, shared.yield_s, shared.chunk_texts, shared.lane) == (0, 0.0, 2, False)
    assert turns_for_stub({**args, "model_instance_kind": "CPU"}, params, True) is None
    monkeypatch.delenv(BOARD_ENVIRONMENT)
    assert turns_for_stub(args, params, True) is None
    holder = hold_query(board_path, 30)
    try:
        started = time.perf_counter()
        with engine_runs(core) as runs:
            core.answer([request(sentences[:2]), request(sentences[2:4])], shared)
        waited = time.perf_counter() - started
    finally:
        holder.kill()
        holder.wait()
    assert runs == [2, 2], "the batch still runs in chunks of ingestion_chunk_texts"
    assert waited < 1.0, f"a chunk waited {waited:.3f} s beside a held query"
