"""An export served in this process by the stage core itself (model_repository/stages/stage_core.py): the requests'
texts read as the stage reads them (prompts, the exported tokenizer, its truncation), the engine, and each
request's outputs or its refusal; what tritonserver's stub would answer, without tritonserver."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from common.contract import SPARSE_THRESHOLD, SPARSE_TOP_K, ServingSpec
from model_repository.stages.engines import load_engine
from model_repository.stages.stage_core import HeldRequest, StageCore
from model_repository.stages.text_input import TextInput

ENGINES = {"onnxruntime_cpu": {"threads": "2"}, "torch": {"precision": "fp32"}}


def stage(export_dir: Path, kind: str = "onnxruntime_cpu", engine=None) -> StageCore:
    """The export's stage core on the engine `kind` (loaded with ENGINES' options), or on `engine` as it is."""
    spec = ServingSpec.load(export_dir)
    params = {
        "max_tokens": str(spec.max_tokens),
        "max_text_bytes": str(1 << 20),
        "max_request_bytes": str(1 << 23),
        SPARSE_TOP_K: "0",
        SPARSE_THRESHOLD: "0",
    }
    engine = engine or load_engine(kind, export_dir, "cpu", ENGINES[kind])
    return StageCore(TextInput(export_dir, params, 1), engine, params, export_dir, lambda *_: None)


@contextlib.contextmanager
def engine_runs(core: StageCore):
    """The texts of each engine run the core records while inside (its own `record` put back after)."""
    runs: list[int] = []
    record = core.record
    core.record = lambda count, lengths, computed=None: runs.append(len(lengths))
    try:
        yield runs
    finally:
        core.record = record


def request(texts: list[str], parameters: dict | None = None, queries: list[str] | None = None,
            asked: tuple[str, ...] = ()) -> HeldRequest:  # fmt: skip
    def column(rows: list[str]) -> np.ndarray:
        return np.array([[row.encode()] for row in rows], dtype=np.object_)

    return HeldRequest(column(texts), None if queries is None else column(queries), json.dumps(parameters or {}), asked)


def served(core: StageCore, texts: list[str], parameters: dict | None = None, queries: list[str] | None = None,
           asked: tuple[str, ...] = ()):  # fmt: skip
    """One request's outputs by name (`asked`: the outputs it names; none: all); AssertionError with the stage's
    message if it refused the request."""
    (answer,) = core.answer([request(texts, parameters, queries, asked)])
    assert not isinstance(answer, str), answer
    return answer


def refusal(core: StageCore, texts: list[str], parameters: dict | None = None) -> str:
    (answer,) = core.answer([request(texts, parameters)])
    assert isinstance(answer, str), "the request was served"
    return answer
