"""The one-stage Triton model, served as `ensemble` (or the model's name): text -> embedding, or label and scores,
or a reranker's (query, text) -> score, or a sparse model's non-zero entries (sparse_output.py), or a multi-vector
model's token vectors (multi_vector_output.py: the requests of each side together, since a side decides how its
texts are tokenized), or of a hybrid model's three the ones each request asks for (hybrid_output.py), in one stub.

The whole data path of a dynamic batch in one execute() (stage_core.py): every text of every request is tokenized
in one call (text_tokenizer.TextTokenizer: packed ids, no padding), the engine runs those packed ids at once, and
each request gets its own rows back. Nothing crosses a process boundary between tokenizing and encoding,
which in the two-stage topology (tokenizer -> encoder) costs a stub round trip and a padded copy per
request. A request over tokenizer.max_text_bytes or max_request_bytes, or with invalid UTF-8, fails with
INVALID_ARG before anything is decoded; the other requests of the batch are served. Beside a query lane on a GPU,
a batch holding ingestion runs in chunks, each in its turn on the GPU, the next tokenized while one computes
(gpu_turns.py).

Custom metrics (stage_metrics.py, sent about once a second), with the two stages' names so that dashboards
read either topology: bert_tokenizer_{requests,tokens}_total, bert_tokenizer_texts_per_execute,
bert_encoder_sequences_per_execute, bert_encoder_{real,padded}_tokens_total; and bert_requests_expired_total, the
requests refused unrun because their deadline had passed (what bench/priority_bench.py checks "none ran" with).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from common.contract import BUDGET_EXPIRED

from .gpu_turns import GpuTurns, turns_for_stub
from .model_args import engine_from_args, instance_count, model_config
from .parent_watch import exit_with_parent
from .stage_core import Answer, StageCore, held
from .stage_metrics import (
    StageMetrics,
    deadline_metrics,
    encoder_counts,
    encoder_metrics,
    tokenizer_counts,
    tokenizer_metrics,
)
from .text_input import TextInput


def response(result: Answer):
    """A request's answer as Triton's: its outputs, or INVALID_ARG with the refusal (the batch's others are served)."""
    if isinstance(result, str):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(result, pb_utils.TritonError.INVALID_ARG))
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in result.items()])


class TritonPythonModel:
    turns: GpuTurns | None = None  # beside a query lane on a GPU (gpu_turns.py)

    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        config, params, version_dir = model_config(args)
        if int(params.get("nice", 0)):  # beside a query lane: the lane's threads get the cores first (configs.py)
            os.nice(int(params["nice"]))  # this thread's, and the engine's threads created after it inherit it
        text = TextInput(version_dir, params, instance_count(config), pb_utils.Logger.log_info)
        self.engine = engine_from_args(args, params, pb_utils.Logger.log_info)
        self._create_metrics(args, int(config["max_batch_size"]))
        self.core = StageCore(text, self.engine, params, version_dir, self._record)
        self.turns = turns_for_stub(args, params, self.engine.queries_first)
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        declared = {**tokenizer_metrics(max_batch_size), **encoder_metrics(max_batch_size), **deadline_metrics()}
        self._metrics = StageMetrics(pb_utils, "pipeline", args, declared)

    def _record(self, requests: int, lengths: np.ndarray, computed_tokens: int | None = None) -> None:
        """One engine call's counts (computed_tokens: the engine's padding included; None: its last call's)."""
        values = tokenizer_counts(requests, lengths)
        if len(lengths):
            computed = self.engine.computed_tokens if computed_tokens is None else computed_tokens
            values |= encoder_counts(len(lengths), int(lengths.sum()), computed)
        self._metrics.add(values)

    def execute(self, requests: list) -> list:
        views = [held(request, self.core.pairs, pb_utils.get_input_tensor_by_name) for request in requests]
        results = self.core.answer(views, self.turns)
        expired = sum(isinstance(result, str) and result.startswith(BUDGET_EXPIRED) for result in results)
        if expired:
            self._metrics.add({"bert_requests_expired_total": expired})
        return [response(result) for result in results]

    def finalize(self) -> None:
        self._metrics.close()
        if self.turns is not None:
            self.turns.board.close()
