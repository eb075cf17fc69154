"""The one-stage data path of pipeline_model.py:
requests' texts -> tokens -> engine -> pooling/head -> each request's outputs, or the message refusing it.

It knows requests only as HeldRequest (its inputs as numpy, its KServe parameters, the outputs it asks for), so it
imports nothing of Triton's. A batch of the plain path (an embedder, classifier, reranker, sparse, hybrid or
multi-vector model, the last one side at a time) goes in three steps, so that the next chunk is tokenized while the
engine runs this one (gpu_turns.py): `prepare` (tokenize), `launch` (the engine; asynchronous where the engine can
be) and `finish` (each request's rows). Late chunks and a static sparse model's queries run whole in `answer_other`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import Callable

import numpy as np

from common.contract import BUDGET_EXPIRED, DEADLINE_PARAMETER, QUERY_INPUT, SCORE_OUTPUT, TEXT_INPUT, TOKENS_OUTPUT

from .classification import label_array, scores_and_labels
from .deadlines import Pace, expired
from .engines import Engine
from .gpu_turns import GpuTurns, NoTurns
from .hybrid_output import HybridOutput
from .late_chunking import LateChunking, chunk_size
from .multi_vector_output import MultiVectorSides, kept_counts, vector_outputs
from .prompts import Prompts
from .sparse_output import SparseOutput
from .static_query import StaticQuery, asks_for_queries
from .text_input import TextInput

Answer = dict[str, np.ndarray] | str  # a request's outputs by name, or why it is refused


@dataclasses.dataclass(eq=False)
class HeldRequest:
    """One request as the stage core reads it; `parameters` is the JSON the Python backend gives."""

    text: np.ndarray
    query: np.ndarray | None
    parameters_json: str
    asked: tuple[str, ...] = ()
    deadline: float = 0.0  # time.monotonic() past which it is refused unrun (0: none)

    def parameters(self) -> str:
        return self.parameters_json

    @functools.cached_property
    def parameter_values(self) -> dict:
        """The KServe parameters, parsed once (its deadline, its lane)."""
        return json.loads(self.parameters_json) if self.parameters_json != "{}" else {}

    def requested_output_names(self) -> tuple[str, ...]:
        return self.asked

    @property
    def rows(self) -> int:
        return int(self.text.size)


def held(request, pairs: bool, get_input: Callable) -> HeldRequest:
    """A Python-backend request as a HeldRequest (`get_input`: pb_utils.get_input_tensor_by_name), with the
    deadline the API front gave it (parameter deadline_ns)."""
    view = HeldRequest(
        get_input(request, TEXT_INPUT).as_numpy(),
        get_input(request, QUERY_INPUT).as_numpy() if pairs else None,
        request.parameters(),
        tuple(request.requested_output_names()),
    )
    deadline_ns = view.parameter_values.get(DEADLINE_PARAMETER)
    if isinstance(deadline_ns, int) and deadline_ns > 0:
        view.deadline = deadline_ns / 1e9
    return view


@dataclasses.dataclass(eq=False)
class Prepared:
    """A plain-path batch between its steps: its requests tokenized, then the engine's pending outputs."""

    requests: list[HeldRequest]
    parts: list
    ids: np.ndarray
    lengths: np.ndarray
    types: np.ndarray | None  # a pair model's token types; a multi-vector model's attended flags
    wanted: frozenset[str] | None
    kept: np.ndarray | None = None  # a multi-vector model's tokens that keep a vector (None: every one)
    pending: Callable[[], object] | None = None  # from launch(): waits for the engine's rows
    computed_tokens: int = 0
    rows: object = None
    collected: bool = False
    chunk: list[HeldRequest] = dataclasses.field(default_factory=list)  # in turns: the chunk, late requests too
    late: frozenset[int] = frozenset()  # in turns: ids of the chunk's requests refused as past their deadline

    def collect(self) -> object:
        """The engine's rows, waited for once (before the engine's buffers take a later batch)."""
        if not self.collected:
            self.rows, self.collected = self.pending(), True
        return self.rows


class StageCore:
    """The stage's tokenizer, engine and task head, from its config parameters."""

    def __init__(
        self, text: TextInput, engine: Engine, params: dict[str, str], version_dir, record: Callable[..., None]
    ) -> None:
        """record(requests, lengths, computed_tokens): each engine call, for the stage's metrics."""
        self.text, self.engine, self.record = text, engine, record
        spec = engine.spec
        self.labels = label_array(spec.labels) if spec.task == "classification" else None
        self.pairs = spec.pairs
        self.sparse = SparseOutput(params, spec.max_active_dims) if spec.task == "sparse" else None
        self.static_query = StaticQuery(version_dir, spec.max_tokens) if spec.static_query else None
        self.prompts = Prompts(spec)
        self.hybrid = HybridOutput(params, spec.hybrid) if spec.task == "hybrid" else None
        self.late = LateChunking(*text.special_tokens()) if spec.task == "embedding" else None
        multi = spec.task == "multi_vector"
        self.sides = MultiVectorSides(version_dir / "tokenizer.json", spec.multi_vector) if multi else None
        self.pace = Pace()  # how soon a chunk can finish, for deadlines (deadlines.py)

    # --- the whole batch at once (the unary model) -----------------------------------------------------------
    def answer(self, requests: list[HeldRequest], turns: GpuTurns | None = None) -> list[Answer]:
        """Each request's answer; with `turns` (gpu_turns.py) the plain path runs in chunks, each launched in its
        turn on the GPU, the next tokenized while this one computes; without, in one."""
        now = time.monotonic()
        late = {index for index, request in enumerate(requests) if expired(request.deadline, now)}
        if late:  # their budget ran out in Triton's queue: refused unrun
            live = [index for index in range(len(requests)) if index not in late]
            answers = [f"{BUDGET_EXPIRED} before the stage took it"] * len(requests)
            for index, result in zip(live, self.answer([requests[i] for i in live], turns), strict=True):
                answers[index] = result
            return answers
        plain, others = self.split(requests)
        answers: list = [None] * len(requests)
        for side, indices in self._engine_calls(requests, plain, answers).items():
            chosen = [requests[i] for i in indices]
            results = self._in_chunks(chosen, turns or NoTurns(), side)
            for index, result in zip(indices, results, strict=True):
                answers[index] = result
        for index, result in zip(others, self.answer_other([requests[i] for i in others]), strict=True):
            answers[index] = result
        return answers

    def _engine_calls(self, requests: list[HeldRequest], plain: list[int], answers: list) -> dict[str | None, list]:
        """The plain path's requests by the engine calls they share: all together, or a multi-vector model's by
        side (a request naming a side the model has not is refused into `answers`)."""
        if self.sides is None:
            return {None: plain} if plain else {}
        by_side: dict[str | None, list[int]] = {}
        for index in plain:
            try:
                by_side.setdefault(self.sides.side(requests[index].parameters()), []).append(index)
            except ValueError as exc:
                answers[index] = str(exc)
        return by_side

    def _in_chunks(
        self, requests: list[HeldRequest], turns: GpuTurns | NoTurns, side: str | None = None
    ) -> list[Answer]:
        """Chunk after chunk (one, without a GPU's turns); a request whose deadline passes before its chunk can
        finish (while the chunks before it run, or its chunk waits its turn) is refused unrun."""
        turns.begin(requests)
        try:
            chunks = turns.chunks(requests)
            if self.engine.queries_first:
                return self._queued(chunks, turns, side)
            results: list[Answer] = []
            prepared = self._prepare_in_time(chunks[0], side)
            for following in [*chunks[1:], None]:
                turns.before_launch()
                prepared = self._in_time_for_its_turn(prepared, side)
                started = time.monotonic()
                try:
                    self.launch(prepared)
                    upcoming = self._prepare_in_time(following, side) if following is not None else None
                    prepared.collect()
                finally:
                    turns.after_collect()
                self.pace.observe(len(prepared.lengths), time.monotonic() - started)
                results += self._answers(prepared)
                prepared = upcoming
            return results
        finally:
            turns.end()

    def _queued(self, chunks: list[list[HeldRequest]], turns: GpuTurns | NoTurns, side: str | None) -> list[Answer]:
        """Every chunk handed at once, a call each, to an engine that queues calls and runs the lane's first (the
        engine process), then answered in order: chunk after chunk left it one stub's chunk at a time, its GPU busy
        45-55 % (docs/results/h100/2026-12-07-g). A chunk's deadline counts the texts queued ahead of it."""
        turns.before_launch()
        started, queued, launched, collecting, results = time.monotonic(), 0, [], 0, []
        try:
            for chunk in chunks:
                prepared = self._prepare_in_time(chunk, side, queued)
                self.launch(prepared)
                queued += len(prepared.lengths)
                launched.append((prepared, queued))
            for prepared, texts in launched:  # each finished while the process runs those behind it
                collecting += 1
                prepared.collect()
                self.pace.observe(texts, time.monotonic() - started)
                results += self._answers(prepared)
        finally:
            for prepared, _ in launched[collecting:]:  # after a failure: read, or the engine would keep them for ever
                with contextlib.suppress(Exception):
                    prepared.collect()
            turns.after_collect()
        return results

    def _answers(self, prepared: Prepared) -> list[Answer]:
        """A chunk's answers in its order, those refused as late among them."""
        answered = iter(self.finish(prepared))
        late = f"{BUDGET_EXPIRED}: its chunk could not finish before its deadline"
        return [late if id(request) in prepared.late else next(answered) for request in prepared.chunk]

    def _prepare_in_time(self, chunk: list[HeldRequest], side: str | None, queued: int = 0) -> Prepared:
        """The chunk's requests tokenized, but for those whose deadline passes before the chunk (behind `queued`
        texts) can finish at the stub's best recent pace (Prepared.late)."""
        by = time.monotonic() + self.pace.soonest_s(queued + sum(request.rows for request in chunk))
        late = frozenset(id(request) for request in chunk if expired(request.deadline, by))
        prepared = self.prepare([request for request in chunk if id(request) not in late], side)
        prepared.chunk, prepared.late = chunk, late
        return prepared

    def _in_time_for_its_turn(self, prepared: Prepared, side: str | None) -> Prepared:
        """Once the chunk's turn has come: tokenized again without the requests it would now finish too late for.
        Only under deadline pressure; otherwise one look at each request's deadline."""
        by = time.monotonic() + self.pace.soonest_s(len(prepared.lengths))
        if any(expired(request.deadline, by) for request in prepared.requests):
            return self._prepare_in_time(prepared.chunk, side)
        return prepared

    def split(self, requests: list[HeldRequest]) -> tuple[list[int], list[int]]:
        """The indices of the plain path's requests, and of those answer_other takes (late chunks, a static sparse
        model's queries)."""
        if self.late is None and self.static_query is None:
            return list(range(len(requests))), []
        plain, others = [], []
        for index, request in enumerate(requests):
            try:
                other = self._other(request.parameters())
            except ValueError:
                other = True  # answer_other words the refusal
            (others if other else plain).append(index)
        return plain, others

    def _other(self, parameters: str) -> bool:
        """Whether answer_other takes the request: late chunks, or a static sparse model's queries."""
        if self.static_query is not None:
            return asks_for_queries(parameters)
        return chunk_size(parameters) is not None

    # --- the plain path in three steps ------------------------------------------------------------------------
    def prepare(self, requests: list[HeldRequest], side: str | None = None) -> Prepared:
        """The requests tokenized (a multi-vector model's as `side` asks: multi_vector_output.py)."""
        if self.sides is not None:
            texts, parts = self.text.gather([request.text for request in requests])
            ids, lengths, attended, kept = self.sides.encode(texts, side)
            return Prepared(requests, parts, ids, lengths, attended, None, None if kept.all() else kept)
        texts_in = [request.text for request in requests]
        queries_in = [request.query for request in requests] if self.pairs else None
        parts, ids, lengths, types = self.text.tokenize(texts_in, queries_in, self.prompts.of(requests))
        wanted = self.hybrid.wanted(requests) if self.hybrid is not None else None
        return Prepared(requests, parts, ids, lengths, types, wanted)

    def launch(self, prepared: Prepared) -> None:
        if not len(prepared.lengths):
            prepared.pending = lambda: None
            return
        prepared.pending = self.engine.submit(
            prepared.ids, prepared.lengths, prepared.types, prepared.wanted, prepared.kept
        )
        prepared.computed_tokens = self.engine.computed_tokens

    def finish(self, prepared: Prepared) -> list[Answer]:
        outputs = prepared.collect()
        ids, lengths = prepared.ids, prepared.lengths
        self.record(len(prepared.requests), lengths, prepared.computed_tokens)
        if self.labels is not None and len(lengths):
            outputs = scores_and_labels(outputs, self.labels)
        tokens = lengths.astype(np.int32).reshape(-1, 1)
        token_ends = np.concatenate([[0], np.cumsum(lengths)])
        if self.sides is not None:  # the engine's rows are the kept tokens', text after text
            counts = lengths if prepared.kept is None else kept_counts(lengths, prepared.kept)
            row_ends = np.concatenate([[0], np.cumsum(counts)])
        answers: list[Answer] = []
        for request, part in zip(prepared.requests, prepared.parts, strict=True):
            if isinstance(part, str):
                answers.append(part)
                continue
            try:
                if self.sides is not None:
                    rows = outputs[row_ends[part.start] : row_ends[part.stop]]
                    out = vector_outputs(rows, counts[part], request.asked)
                elif self.hybrid is not None:
                    own_tokens = slice(token_ends[part.start], token_ends[part.stop])
                    out = self.hybrid.tensors(outputs, ids, lengths, part, own_tokens, request)
                elif self.sparse is not None:
                    out = self.sparse.tensors(outputs[part], request.parameters())
                elif self.pairs:
                    out = {SCORE_OUTPUT: outputs[part]}
                elif self.labels is None:
                    out = {"embedding": outputs[part]}
                else:
                    out = {"scores": outputs[0][part], "label": outputs[1][part]}
            except ValueError as exc:
                answers.append(str(exc))
                continue
            out[TOKENS_OUTPUT] = tokens[part]
            answers.append(out)
        return answers

    # --- late chunks and a static sparse model's queries ------------------------------------------------------
    def answer_other(self, requests: list[HeldRequest]) -> list[Answer]:
        if not requests:
            return []
        if self.static_query is not None:
            return self._static_queries(requests)
        answers: list = [None] * len(requests)
        groups: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            try:
                groups.setdefault(chunk_size(request.parameters()), []).append(index)
            except ValueError as exc:
                answers[index] = str(exc)
        for size, indices in groups.items():
            for index, result in zip(indices, self._late_chunks([requests[i] for i in indices], size), strict=True):
                answers[index] = result
        return answers

    def _late_chunks(self, requests: list[HeldRequest], size: int) -> list[Answer]:
        """Each text in one pass, its chunks of `size` tokens pooled (late_chunking.py); the engine's refusal (one
        that pools whole sequences only) is every request's."""
        texts_in = [request.text for request in requests]
        parts, ids, lengths, _ = self.text.tokenize(texts_in, None, self.prompts.of(requests))
        bounds, per_text, kept = self.late.spans(lengths, size)
        try:
            pooled = self.engine.pool_spans(ids, lengths, bounds) if len(lengths) else None
        except (NotImplementedError, ValueError) as exc:
            return [part if isinstance(part, str) else str(exc) for part in parts]
        self.record(len(requests), lengths, self.engine.computed_tokens)
        span_ends = np.concatenate([[0], np.cumsum(per_text)])
        answers: list[Answer] = []
        for part in parts:
            if isinstance(part, str):
                answers.append(part)
                continue
            spans = slice(span_ends[part.start], span_ends[part.stop])
            outputs = self.late.tensors(pooled[spans], per_text[part], kept[spans])
            outputs[TOKENS_OUTPUT] = lengths[part].astype(np.int32).reshape(-1, 1)
            answers.append(outputs)
        return answers

    def _static_queries(self, requests: list[HeldRequest]) -> list[Answer]:
        """A static sparse model's queries: each token's weight, no engine (static_query.py)."""
        texts, parts = self.text.gather([request.text for request in requests], self.prompts.of(requests))
        rows, lengths = self.static_query.rows(texts)
        answers: list[Answer] = []
        for request, part in zip(requests, parts, strict=True):
            if isinstance(part, str):
                answers.append(part)
                continue
            try:
                outputs = self.sparse.tensors(rows[part], request.parameters())
            except ValueError as exc:
                answers.append(str(exc))
                continue
            outputs[TOKENS_OUTPUT] = lengths[part].reshape(-1, 1)
            answers.append(outputs)
        return answers
