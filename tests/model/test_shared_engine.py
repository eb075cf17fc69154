"""engine.options.shared_process: a stage's stubs on one device call one engine process (engines/engine_process.py)
through engines/shared.py. Here on the CPU with the torch engine in fp32, against that engine in this process, and
served by tritonserver with two instances."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from bench.process_cpu import engine_batching, snapshot
from client import TextClient
from common.contract import ServingSpec
from common.gpu_board import GpuBoard
from common.process_state import running
from model_repository.generate import generate
from model_repository.stages.engines import engine_process, load_engine
from model_repository.stages.engines import shared as shared_module
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.engines.engine_process import Call, Scheduler
from model_repository.stages.engines.shared import SharedEngine, process_stats
from model_repository.stages.gpu_turns import GpuTurns
from serving.launcher.harness import local_server
from settings import load_settings
from tests.model.stage_run import request, stage
from tests.server.api_front_process import Front, urls

OPTIONS = {"precision": "fp32", "inner_kind": "torch"}


@pytest.fixture(scope="module")
def token_batches(exported, sentences) -> list[tuple[np.ndarray, np.ndarray]]:
    tokenizer = Tokenizer.from_file(str(exported / "tokenizer.json"))
    rows = [encoding.ids for encoding in tokenizer.encode_batch(sentences)]
    return [pack_sequences(rows[start : start + size]) for start, size in ((0, 1), (1, 5), (6, 17), (23, 9))]


@pytest.fixture(scope="module")
def direct(exported):
    return load_engine("torch", exported, "cpu", {"precision": "fp32"})


def shared(exported, parent_pid: int, **extra) -> SharedEngine:
    return SharedEngine(exported, ServingSpec.load(exported), "cpu", {**OPTIONS, "parent_pid": parent_pid, **extra})


@pytest.fixture(scope="module")
def parent():
    """The engine process's tritonserver stand-in: it ends when this does."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def test_rows_are_the_engine_s_own_and_stubs_share_one_process(exported, direct, token_batches, parent):
    first, second = shared(exported, parent.pid), shared(exported, parent.pid, query=True)
    assert first.socket_path == second.socket_path
    for ids, lengths in token_batches:
        expected = direct.forward_packed(ids, lengths)
        np.testing.assert_allclose(first.forward_packed(ids, lengths), expected, atol=1e-5)
        np.testing.assert_allclose(second.forward_packed(ids, lengths), expected, atol=1e-5)


def test_calls_in_flight_come_back_in_order_to_each_caller(exported, direct, token_batches, parent):
    """Each of 4 callers pipelines its 4 batches (all submitted, then collected) while the others do: the process
    batches their calls together, every row goes back to its own caller, and its counters (asked over a connection
    of their own, as the benchmarks ask) count each call and sequence once."""
    expected = [direct.forward_packed(ids, lengths) for ids, lengths in token_batches]
    engines = [shared(exported, parent.pid, query=index == 0) for index in range(4)]
    failures: list[str] = []
    before = process_stats(engines[0].socket_path)

    def caller(engine: SharedEngine, shift: int) -> None:
        order = token_batches[shift:] + token_batches[:shift]
        wanted = expected[shift:] + expected[:shift]
        for _ in range(5):
            collects = [engine.submit(ids, lengths) for ids, lengths in order]
            for collect, rows in zip(collects, wanted, strict=True):
                if not np.allclose(collect(), rows, atol=1e-5):
                    failures.append(f"caller {shift}")

    threads = [threading.Thread(target=caller, args=(engine, index)) for index, engine in enumerate(engines)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures
    after = process_stats(engines[0].socket_path)
    calls = after["calls"] - before["calls"]
    assert calls == 4 * 5 * len(token_batches)
    assert after["sequences"] - before["sequences"] == 4 * 5 * sum(len(lengths) for _, lengths in token_batches)
    batches = after["batches"] - before["batches"]
    assert 1 <= batches <= calls and after["query_batches"] - before["query_batches"] <= batches
    batching = engine_batching({"e": before}, {"e": after}, 1.0)
    assert batching["calls_per_batch"] == round(calls / batches, 2) and batching["batches_per_s"] == batches
    counted = snapshot(parent.pid)  # the benchmarks' CPU by process kind finds the process by its server's pid
    (stats,) = counted["engine stats"].values()
    assert running(stats["pid"]) and counted["engine process"] > 0
    assert "engine process" not in snapshot(os.getpid()), "another server's engine processes are not counted"


def test_a_stub_that_has_not_read_its_rows_yet_holds_up_no_other(exported, token_batches, parent):
    """Rows larger than a socket's buffer wait in the process for their stub, which reads them only when it
    collects (after sending its next call), while the process answers the other stubs."""
    ids, lengths = pack_sequences([row for _ in range(8) for row in unpacked(*token_batches[2])])  # 136 rows
    slow, other = shared(exported, parent.pid), shared(exported, parent.pid)
    pending = [slow.submit(ids, lengths) for _ in range(3)]  # 3 x 136 x 384 floats, not read yet
    answered = threading.Event()
    thread = threading.Thread(target=lambda: (other.forward_packed(*token_batches[0]), answered.set()))
    thread.start()
    try:
        assert answered.wait(60), "a stub's unread rows held up another stub's call"
    finally:
        for collect in pending:
            assert collect().shape == (len(lengths), 384)
        thread.join(60)


def test_a_stub_hands_the_process_every_chunk_of_a_batch_before_it_collects_one(exported, sentences, parent, tmp_path):
    """A stage on the process cuts ingestion into chunks as on its own engine, but sends them all before collecting
    the first, so that the process can batch them with other stubs' calls and run queries between them. The answers
    are one batch's; a request whose deadline the texts queued ahead of its chunk cannot meet is refused unrun."""
    engine = shared(exported, parent.pid)
    events: list[str] = []
    submit = engine.submit

    def logged_submit(*args, **kwargs):
        events.append("submit")
        reader = submit(*args, **kwargs)
        return lambda: (events.append("collect"), reader())[1]

    engine.submit = logged_submit
    core, direct_core = stage(exported, engine=engine), stage(exported, "torch")
    turns = GpuTurns(GpuBoard(tmp_path / "board"), 0, lane=False, chunk_texts=2, on_gpu=0, yield_s=0.0)
    requests = [request(sentences[:2]), request(sentences[2:4]), request(sentences[4:5])]  # a chunk each
    core.pace.observe(2, 0.1)  # 2 texts in 0.1 s: the second chunk alone would finish in time, behind the first not
    requests[1].deadline = time.monotonic() + 0.15
    answers = core.answer(requests, turns)
    assert events == ["submit", "submit", "collect", "collect"], "the late request's chunk sent nothing"
    assert isinstance(answers[1], str) and "time budget ran out" in answers[1]
    for answer, expected in zip([answers[0], answers[2]], direct_core.answer([requests[0], requests[2]]), strict=True):
        np.testing.assert_allclose(answer["embedding"], expected["embedding"], atol=1e-5)


def test_a_batch_whose_later_chunk_fails_to_launch_leaves_no_rows_behind(exported, sentences, parent, tmp_path):
    """Chunks already sent when a later one fails are still read: their rows would otherwise wait in the stub's
    engine, read ahead by its next collect and never taken."""
    engine = shared(exported, parent.pid)
    submit, submits = engine.submit, []

    def failing_second(*args, **kwargs):
        submits.append(1)
        if len(submits) == 2:
            raise OSError("the engine process is gone")
        return submit(*args, **kwargs)

    engine.submit = failing_second
    core = stage(exported, engine=engine)
    turns = GpuTurns(GpuBoard(tmp_path / "board"), 0, lane=False, chunk_texts=2, on_gpu=0, yield_s=0.0)
    with pytest.raises(OSError, match="gone"):
        core.answer([request(sentences[:2]), request(sentences[2:4])], turns)
    assert not engine.unanswered
    engine.submit = submit
    assert core.answer([request(sentences[4:6])], turns)[0]["embedding"].shape == (2, 384)
    assert not engine.answers and not engine.unanswered


def unpacked(ids: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(ids, np.cumsum(lengths)[:-1])


def test_a_failed_call_is_answered_and_the_process_serves_on(exported, direct, token_batches, parent):
    engine = shared(exported, parent.pid)
    ids, lengths = token_batches[1]
    with pytest.raises(RuntimeError, match=r"the engine process: .*index"):
        engine.forward_packed(np.full_like(ids, 10_000_000), lengths)  # no such token
    np.testing.assert_allclose(engine.forward_packed(ids, lengths), direct.forward_packed(ids, lengths), atol=1e-5)


def engine_processes(engine: SharedEngine) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(engine.stem).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_a_process_that_died_is_started_again_by_the_next_call(exported, direct, token_batches, parent):
    engine, other = shared(exported, parent.pid), shared(exported, parent.pid)
    ids, lengths = token_batches[2]
    (pid,) = engine_processes(engine)
    os.kill(pid, signal.SIGKILL)
    for stub in (engine, other):  # each stub's next call: the one that finds it gone starts it, the other connects
        np.testing.assert_allclose(stub.forward_packed(ids, lengths), direct.forward_packed(ids, lengths), atol=1e-5)
    assert len(engine_processes(engine)) == 1


def test_a_hung_process_is_replaced_by_the_next_stub_that_connects(
    exported, direct, token_batches, parent, monkeypatch
):
    """A stopped process's listener still accepts connections: a stub reloaded after the canary found the model hung
    would wait on it for ever. The first one to connect finds it silent, ends it and starts another."""
    monkeypatch.setattr(shared_module, "ANSWERS_WITHIN_S", 1.0)
    engine = shared(exported, parent.pid)
    (hung,) = engine_processes(engine)
    os.kill(hung, signal.SIGSTOP)
    ids, lengths = token_batches[1]
    answered: list = []

    def reloaded_stub() -> None:  # in a thread: without the check its call never returns
        stub = shared(exported, parent.pid)
        answered.append((stub, stub.forward_packed(ids, lengths)))

    try:
        reload = threading.Thread(target=reloaded_stub, daemon=True)
        reload.start()
        reload.join(60)
        assert answered, "the reloaded stub's call did not come back within 60 s"
        reloaded, rows = answered[0]
        np.testing.assert_allclose(rows, direct.forward_packed(ids, lengths), atol=1e-5)
        assert engine_processes(reloaded) != [hung] and len(engine_processes(reloaded)) == 1
        assert not running(hung)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGKILL)


def test_outputs_that_are_not_rows_are_refused_at_load(exported):
    sparse = dataclasses.replace(ServingSpec.load(exported), task="sparse")
    with pytest.raises(ValueError, match="shared_process serves row outputs"):
        SharedEngine(exported, sparse, "cpu", {**OPTIONS, "parent_pid": os.getpid()})


def test_the_process_ends_with_its_tritonserver(exported, token_batches):
    parent = subprocess.Popen(["sleep", "600"])
    engine = shared(exported, parent.pid)
    engine.forward_packed(*token_batches[0])
    parent.kill()
    parent.wait()
    assert not files_left(engine.stem)


def files_left(stem: Path, within_s: float = 30) -> list[Path]:
    """The engine process's files still there after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while (found := list(stem.parent.glob(stem.name + ".*"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_served_by_tritonserver_through_one_process(exported, sentences, reference_model, tmp_path):
    """Two instances of the model and the query lane's, all calling the one engine process the first stub started,
    through gRPC and through the API front's one-text queries, which the process counts as queries'."""
    settings = load_settings(None, ['engine.precision="fp32"', 'engine.kind="torch"', "encoder.instances=2",
                                    "engine.options={shared_process=true}"])  # fmt: skip
    repository = generate(settings, exported, tmp_path / "repository")
    server = local_server(settings, repository, tmp_path / "server").start()
    try:
        with TextClient(server.grpc_url, "grpc") as client:
            served = client.embed(sentences)
        front = Front(repository, urls(server))  # one text a request: the query lane's stub (no GPU here)
        try:
            queried = [front.post("/v1/embeddings", {"input": text}).json()["data"][0]["embedding"]
                       for text in sentences[:4]]  # fmt: skip
        finally:
            front.stop()
        log = server.log_path.read_text()
        sockets = {line.rsplit(" ", 1)[1] for line in log.splitlines() if "shares the engine process at" in line}
        stats = process_stats(Path(next(iter(sockets)).strip('"')))
    finally:
        server.stop()
    np.testing.assert_allclose(np.array(queried), served[:4], atol=1e-5)
    expected = reference_model.encode(sentences, convert_to_numpy=True)
    cosine = (served * expected).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.9999, cosine.min()
    assert stats["query_batches"] >= 4, "the lane's calls (its config's query_lane) run as queries"
    # the model's two instances and the query lane's one: all on the one process, which ended with tritonserver
    assert log.count("shares the engine process at") == 3 and len(sockets) == 1, log[-3000:]
    assert not files_left(Path(sockets.pop().strip('"')).with_suffix(""))


def test_ingestion_batches_stay_within_a_chunk_while_queries_come(monkeypatch):
    """Queries run first as a batch of their own; while they come, an ingestion batch takes at most the stubs' chunk
    of sequences (whole calls, at least one), and once none came for QUERIES_COME_S, as many calls as fit the tokens."""

    def call(sequences: int, query: bool = False) -> Call:
        lengths = np.full(sequences, 3, np.int64)
        return Call(None, lengths, np.zeros(3 * sequences, np.int32), None, query)

    scheduler = Scheduler(max_tokens=60, texts_beside_queries=4)
    for sequences in (2, 2, 3):
        scheduler.add(call(sequences))
    assert [len(c.lengths) for c in scheduler.next_batch()] == [2, 2, 3], "alone: one batch up to the tokens"
    for sequences in (2, 1, 2, 5, 1):
        scheduler.add(call(sequences))
    scheduler.add(call(1, query=True))
    scheduler.add(call(2, query=True))
    batches = []
    while scheduler:
        batches.append([(len(c.lengths), c.query) for c in scheduler.next_batch()])
    assert batches == [[(1, True), (2, True)], [(2, False), (1, False)], [(2, False)], [(5, False)], [(1, False)]]
    monkeypatch.setattr(engine_process, "QUERIES_COME_S", 0.0)
    for sequences in (2, 1, 2, 5):
        scheduler.add(call(sequences))
    assert [len(c.lengths) for c in scheduler.next_batch()] == [2, 1, 2, 5]
    assert scheduler.stats.calls == 14 and scheduler.stats.query_batches == 1
