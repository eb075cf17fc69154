"""serving/launcher/canary.py without a server: which answers pass, what a probe asks for, and when failing canaries
make a hang (tests/server/test_liveness_canary.py stops a real tritonserver)."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from common.contract import (
    CHUNK_COUNTS,
    CHUNK_EMBEDDINGS,
    QUERY_INPUT,
    SCORE_OUTPUT,
    TEXT_INPUT,
    TOKEN_COUNTS,
    TOKEN_VECTORS,
    TOKENS_OUTPUT,
)
from serving.launcher.canary import CANARY_TEXT, Canary, Hang, Probe, answer_problem, grpc_target, probe_for

EMBEDDER = {"embedding": (np.float32, (384,)), TOKENS_OUTPUT: (np.int32, (1,))}


def embedding_answer(**changes) -> dict[str, np.ndarray]:
    answer = {"embedding": np.full((1, 384), 0.05, np.float32), TOKENS_OUTPUT: np.array([[5]], np.int32)}
    return {**answer, **changes}


def test_the_answer_its_task_promises_passes():
    assert answer_problem(embedding_answer(), EMBEDDER) is None
    label = {"label": (object, (1,)), "scores": (np.float32, (3,))}
    assert answer_problem({"label": np.array([["ok"]], object), "scores": np.ones((1, 3), np.float32)}, label) is None
    sparse = {"sparse_indices": (np.int32, (-1,)), "sparse_values": (np.float32, (-1,))}
    answer = {"sparse_indices": np.array([[3, 7]], np.int32), "sparse_values": np.array([[0.5, 1.0]], np.float32)}
    assert answer_problem(answer, sparse) is None  # -1: any width


def test_a_packed_output_has_as_many_rows_as_its_count_says():
    multi_vector = {TOKEN_VECTORS: (np.float16, (8,)), TOKEN_COUNTS: (np.int32, (1,))}
    counts = np.array([[3]], np.int32)
    assert answer_problem({TOKEN_VECTORS: np.ones((3, 8), np.float16), TOKEN_COUNTS: counts}, multi_vector) is None
    short = answer_problem({TOKEN_VECTORS: np.ones((2, 8), np.float16), TOKEN_COUNTS: counts}, multi_vector)
    assert short == f"{TOKEN_VECTORS} has shape [2, 8], not [3, 8]"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (embedding_answer(embedding=np.zeros((1, 128), np.float32)), "embedding has shape [1, 128], not [1, 384]"),
        (embedding_answer(embedding=np.zeros((2, 384), np.float32)), "embedding has shape [2, 384]"),
        (embedding_answer(embedding=np.zeros((1, 384), np.float64)), "embedding is float64, not float32"),
        (embedding_answer(embedding=np.full((1, 384), np.nan, np.float32)), "embedding has values that are not finite"),
        (embedding_answer(**{TOKENS_OUTPUT: np.array([[0]], np.int32)}), "tokens counts 0 tokens"),
        ({TOKENS_OUTPUT: np.array([[5]], np.int32)}, "no embedding output"),
    ],
)
def test_a_wrong_answer_is_named(answer, problem):
    assert answer_problem(answer, EMBEDDER).startswith(problem)


def config(name: str, inputs: tuple[str, ...], outputs: dict[str, tuple[int, list[int]]]) -> mc.ModelConfig:
    return mc.ModelConfig(
        name=name,
        input=[mc.ModelInput(name=i, data_type=mc.TYPE_STRING, dims=[1]) for i in inputs],
        output=[mc.ModelOutput(name=o, data_type=t, dims=d) for o, (t, d) in outputs.items()],
    )


def test_a_probe_sends_every_input_and_asks_for_the_outputs_every_answer_has():
    reranker = config(
        "reranker", (QUERY_INPUT, TEXT_INPUT), {SCORE_OUTPUT: (mc.TYPE_FP32, [1]), TOKENS_OUTPUT: (mc.TYPE_INT32, [1])}
    )
    probe = probe_for(reranker)
    request = service_pb2.ModelInferRequest.FromString(probe.request)
    assert request.model_name == "reranker" and [i.name for i in request.inputs] == [QUERY_INPUT, TEXT_INPUT]
    assert all(list(i.shape) == [1, 1] for i in request.inputs)
    assert request.raw_input_contents[0][4:] == CANARY_TEXT.encode()
    assert probe.outputs == {SCORE_OUTPUT: (np.float32, (1,)), TOKENS_OUTPUT: (np.int32, (1,))}
    embedder = config(
        "ensemble",
        (TEXT_INPUT,),
        {
            "embedding": (mc.TYPE_FP32, [384]),
            TOKENS_OUTPUT: (mc.TYPE_INT32, [1]),
            CHUNK_EMBEDDINGS: (mc.TYPE_FP32, [384]),
            CHUNK_COUNTS: (mc.TYPE_INT32, [1]),
        },
    )
    probe = probe_for(embedder)
    request = service_pb2.ModelInferRequest.FromString(probe.request)
    assert [o.name for o in request.outputs] == ["embedding", TOKENS_OUTPUT]  # late chunks need chunk_tokens


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "Socket closed"


class DeadlineExceeded(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


def stand_in_canary(timeout_s: float, answers: list, paused=lambda: False, answered=None) -> Canary:
    """A Canary whose calls return (or raise) `answers` in turn, encoded as Triton would answer, and whose
    statistics say `answered` (a list: its first item, or None as an unanswered call; 0 requests by default)."""
    canary = Canary("127.0.0.1:1", [Probe("ensemble", b"", EMBEDDER)], 60.0, timeout_s, lambda _: None, paused)

    def infer(_request, timeout, metadata):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        response = service_pb2.ModelInferResponse()
        for name, array in answer.items():
            response.outputs.add(name=name, datatype={"f": "FP32", "i": "INT32"}[array.dtype.kind], shape=array.shape)
            response.raw_output_contents.append(array.tobytes())
        return response.SerializeToString()

    canary._infer = infer
    canary.answered = lambda _model: (answered or [0])[0]
    return canary


def test_a_model_is_hung_once_its_canaries_fail_for_the_timeout():
    wrong = embedding_answer(embedding=np.zeros((1, 128), np.float32))
    canary = stand_in_canary(0.3, [wrong, Unavailable(), embedding_answer(), Unavailable(), wrong])
    assert canary.check() is None  # one wrong answer: not yet
    time.sleep(0.1)
    assert canary.check() is None  # still failing, within the timeout
    assert canary.check() is None  # a good answer ends the failing run
    assert canary.check() is None
    time.sleep(0.35)
    hang = canary.check()
    assert hang.model == "ensemble" and hang.reason.startswith("ensemble: no good canary answer for 0.")
    assert "the last: embedding has shape [1, 128], not [1, 384]; it answered no request since" in hang.reason
    canary.stop()


def test_a_canary_queued_behind_answered_work_is_busy_not_hung():
    """Deadlines while the model answers other requests: busy, and the failing run starts again; once it answers
    nothing, hung."""
    answered = [10]
    canary = stand_in_canary(0.2, [embedding_answer(), *[DeadlineExceeded()] * 4], answered=answered)
    assert canary.check() is None  # good: 10 answered so far
    assert canary.check() is None  # the first deadline
    time.sleep(0.25)
    answered[0] = 50
    assert canary.check() is None  # 40 answered meanwhile: busy
    assert canary.check() is None  # a new failing run, within the timeout
    time.sleep(0.25)
    hang = canary.check()  # nothing answered since: hung
    assert hang == Hang("ensemble", hang.reason) and "it answered no request since" in hang.reason
    canary.stop()


def test_a_tritonserver_that_does_not_answer_its_statistics_is_hung_itself():
    canary = stand_in_canary(0.1, [DeadlineExceeded(), DeadlineExceeded()], answered=[None])
    assert canary.check() is None
    time.sleep(0.15)
    hang = canary.check()
    assert hang.model is None and hang.reason.endswith("tritonserver did not answer its statistics either"), hang
    canary.stop()


def test_failures_while_paused_do_not_count():
    paused = [True]
    canary = stand_in_canary(0.2, [Unavailable(), Unavailable()], lambda: paused[0])
    assert canary.check() is None  # paused: not even sent
    paused[0] = False
    assert canary.check() is None
    paused[0] = True
    time.sleep(0.25)
    assert canary.check() is None
    paused[0] = False
    assert canary.check() is None  # the failing run began again after the pause
    canary.stop()


def test_the_canary_reaches_a_server_on_every_address_through_the_loopback():
    assert grpc_target("0.0.0.0:8001") == "127.0.0.1:8001"
    assert grpc_target("127.0.0.1:9") == "127.0.0.1:9"
