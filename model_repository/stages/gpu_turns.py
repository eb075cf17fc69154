"""GpuTurns: a one-stage model's stubs and its query lane's taking turns on their GPU (common/gpu_board.py).

Several stubs on one GPU are several CUDA contexts, which the GPU time-slices without knowing which kernels are a
query's. So the stubs agree among themselves:
- the lane's stub marks its slot QUERYING from the moment it holds queries until they are answered;
- a model's stub cuts a batch that holds ingestion into chunks of at most priority.ingestion_chunk_texts texts
  (at request boundaries), and before it launches each one waits while a query is held on its GPU, or while
  priority.ingestion_on_gpu other chunks run there, for at most priority.query_yield_ms (so a steady flow of
  queries cannot starve ingestion). A query thus waits on the GPU for the chunks already launched, at most
  ingestion_on_gpu of them;
- a batch made only of queries (the API front's, sent to the model itself while no ingestion runs: parameter
  lane = "query") is neither marked nor cut.
A stub whose engine runs the lane's calls first itself (the engine process, engines/shared.py) still cuts and marks
its chunks but never waits, and hands them all to the process at once (stage_core.py): there a wait only kept other
stubs' calls out of the process's batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from common.contract import LANE_PARAMETER
from common.gpu_board import INGESTING, ON_GPU, QUERYING, GpuBoard

POLL_S = 0.0001  # how often a waiting chunk looks at the board again


def is_query(request) -> bool:
    """Whether a request's KServe parameters name it a query (lane = "query")."""
    return request.parameter_values.get(LANE_PARAMETER) == "query"


class GpuTurns:
    """One stub's side of the board: `lane` for a query lane's stub, else a model's."""

    def __init__(self, board: GpuBoard, gpu: int, lane: bool, chunk_texts: int, on_gpu: int, yield_s: float) -> None:
        self.board, self.gpu, self.lane = board.claim(gpu), gpu, lane
        self.chunk_texts, self.on_gpu, self.yield_s = chunk_texts, on_gpu, yield_s
        self.ingesting = False

    def begin(self, requests: Sequence) -> None:
        """A batch arrives: the lane holds queries; a model's batch ingests unless each request is a query."""
        if self.lane:
            self.board.mark(QUERYING)
            return
        self.ingesting = not all(is_query(request) for request in requests)
        if self.ingesting:
            self.board.mark(INGESTING)
            self.board.stamp()

    def chunks(self, requests: list) -> list[list]:
        """The batch in the pieces launched one after another: whole for queries, else at request boundaries."""
        if not self.ingesting or self.chunk_texts <= 0:
            return [requests]
        pieces: list[list] = [[]]
        texts = 0
        for request in requests:
            if pieces[-1] and texts + request.rows > self.chunk_texts:
                pieces.append([])
                texts = 0
            pieces[-1].append(request)
            texts += request.rows
        return pieces

    def before_launch(self) -> None:
        """An ingestion chunk waits its turn: no query held on this GPU, fewer than on_gpu chunks running."""
        if not self.ingesting:
            return
        give_up = time.perf_counter() + self.yield_s
        while time.perf_counter() < give_up and (
            self.board.count(QUERYING, self.gpu) or (self.on_gpu and self.board.count(ON_GPU, self.gpu) >= self.on_gpu)
        ):
            time.sleep(POLL_S)
        self.board.mark(INGESTING | ON_GPU)

    def after_collect(self) -> None:
        if self.ingesting:
            self.board.mark(INGESTING)

    def end(self) -> None:
        if self.ingesting:
            self.board.stamp()
        self.board.mark(0)
        self.ingesting = False


def turns_for_stub(args: dict, params: dict, queries_first: bool) -> GpuTurns | None:
    """A stub's turns on its GPU beside a query lane (configs.py sets gpu_turns = lane | model), where the launcher
    made the server a board; else None. `queries_first`: its engine orders the lane's calls itself."""
    role = params.get("gpu_turns")
    board = GpuBoard.from_environment() if role and args.get("model_instance_kind") == "GPU" else None
    if board is None:
        return None
    on_gpu, yield_ms = int(params["ingestion_on_gpu"]), float(params["query_yield_ms"])
    if queries_first:  # one engine process: 1.26-1.36x the one-text requests/s (docs/results/h100/2026-12-07-f)
        on_gpu, yield_ms = 0, 0.0
    gpu, chunk_texts = int(args["model_instance_device_id"]), int(params["ingestion_chunk_texts"])
    return GpuTurns(board, gpu, role == "lane", chunk_texts, on_gpu, yield_ms / 1000)


class NoTurns:
    """A stub that takes no turns (no board: a CPU, or no query lane): its batch is one chunk, launched at once."""

    def begin(self, requests: Sequence) -> None:
        pass

    def chunks(self, requests: list) -> list[list]:
        return [requests]

    def before_launch(self) -> None:
        pass

    def after_collect(self) -> None:
        pass

    def end(self) -> None:
        pass
