"""The one-stage Triton model, served as `ensemble` (or the model's name): text -> embedding, or label and scores,
or a reranker's (query, text) -> score, or a sparse model's non-zero entries (sparse_output.py), or a multi-vector
model's token vectors (multi_vector_output.py: the requests of each side together, since a side decides how its
texts are tokenized), or of a hybrid model's three the ones each request asks for (hybrid_output.py), in one stub.

The whole data path of a dynamic batch in one execute(): every text of every request is tokenized in one
call (text_tokenizer.TextTokenizer: packed ids, no padding), the engine runs those packed ids at once, and
each request gets its own rows back. Nothing crosses a process boundary between tokenizing and encoding,
which in the two-stage topology (tokenizer -> encoder) costs a stub round trip and a padded copy per
request. A request over tokenizer.max_text_bytes or max_request_bytes, or with invalid UTF-8, fails with
INVALID_ARG before anything is decoded; the other requests of the batch are served.

Custom metrics (stage_metrics.py, sent about once a second), with the two stages' names so that dashboards
read either topology: bert_tokenizer_{requests,tokens}_total, bert_tokenizer_texts_per_execute,
bert_encoder_sequences_per_execute, bert_encoder_{real,padded}_tokens_total.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from common.contract import QUERY_INPUT, SCORE_OUTPUT, TEXT_INPUT, TOKENS_OUTPUT

from .classification import label_array, scores_and_labels
from .hybrid_output import HybridOutput
from .late_chunking import LateChunking, chunk_size
from .model_args import engine_from_args, instance_count, model_config
from .multi_vector_output import MultiVectorSides, answer
from .parent_watch import exit_with_parent
from .sparse_output import SparseOutput
from .stage_metrics import StageMetrics, encoder_counts, encoder_metrics, tokenizer_counts, tokenizer_metrics
from .text_input import TextInput


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        config, params, version_dir = model_config(args)
        if int(params.get("nice", 0)):  # beside a query lane: the lane's threads get the cores first (configs.py)
            os.nice(int(params["nice"]))  # this thread's, and the engine's threads created after it inherit it
        self.text = TextInput(version_dir, params, instance_count(config), pb_utils.Logger.log_info)
        self.engine = engine_from_args(args, params, pb_utils.Logger.log_info)
        spec = self.engine.spec
        self.labels = label_array(spec.labels) if spec.task == "classification" else None
        self.pairs = spec.pairs
        self.sparse = SparseOutput(params) if spec.task == "sparse" else None
        self.hybrid = HybridOutput(params, spec.hybrid) if spec.task == "hybrid" else None
        self.late = LateChunking(*self.text.special_tokens()) if spec.task == "embedding" else None
        multi = spec.task == "multi_vector"
        self.sides = MultiVectorSides(version_dir / "tokenizer.json", spec.multi_vector) if multi else None
        self._create_metrics(args, int(config["max_batch_size"]))
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        declared = {**tokenizer_metrics(max_batch_size), **encoder_metrics(max_batch_size)}
        self._metrics = StageMetrics(pb_utils, "pipeline", args, declared)

    def execute(self, requests: list) -> list:
        if self.sides is not None:
            return self._multi_vector(requests)
        if self.late is None:
            return self._batch(requests)
        responses: list = [None] * len(requests)  # an embedder's: each late chunk size's requests apart
        groups: dict[int | None, list[int]] = {}
        for index, request in enumerate(requests):
            try:
                groups.setdefault(chunk_size(request.parameters()), []).append(index)
            except ValueError as exc:
                responses[index] = refused(str(exc))
        for size, indices in groups.items():
            for index, response in zip(indices, self._batch([requests[i] for i in indices], size), strict=True):
                responses[index] = response
        return responses

    def _batch(self, requests: list, chunk_tokens: int | None = None) -> list:
        """Requests tokenized and run together; with chunk_tokens, an embedder's late chunks."""
        texts_in = [pb_utils.get_input_tensor_by_name(request, TEXT_INPUT).as_numpy() for request in requests]
        queries_in = (
            [pb_utils.get_input_tensor_by_name(r, QUERY_INPUT).as_numpy() for r in requests] if self.pairs else None
        )
        parts, ids, lengths, types = self.text.tokenize(texts_in, queries_in)
        if chunk_tokens is not None:
            return self._late_chunks(requests, parts, ids, lengths, chunk_tokens)
        wanted = self.hybrid.wanted(requests) if self.hybrid is not None else None
        outputs = self.engine.forward_packed(ids, lengths, types, wanted) if len(lengths) else None
        self._record(len(requests), lengths)
        if self.labels is not None and len(lengths):
            outputs = scores_and_labels(outputs, self.labels)
        tokens = lengths.astype(np.int32).reshape(-1, 1)
        token_ends = np.concatenate([[0], np.cumsum(lengths)])
        responses = []
        for request, part in zip(requests, parts, strict=True):
            if isinstance(part, str):
                responses.append(refused(part))
                continue
            if self.hybrid is not None:
                own_tokens = slice(token_ends[part.start], token_ends[part.stop])
                try:
                    chosen = self.hybrid.tensors(outputs, ids, lengths, part, own_tokens, request)
                except ValueError as exc:
                    responses.append(refused(str(exc)))
                    continue
                tensors = [pb_utils.Tensor(name, array) for name, array in chosen.items()]
            elif self.sparse is not None:
                try:
                    cut = self.sparse.tensors(outputs[part], request.parameters())
                except ValueError as exc:
                    responses.append(refused(str(exc)))
                    continue
                tensors = [pb_utils.Tensor(name, array) for name, array in cut.items()]
            elif self.pairs:
                tensors = [pb_utils.Tensor(SCORE_OUTPUT, outputs[part])]
            elif self.labels is None:
                tensors = [pb_utils.Tensor("embedding", outputs[part])]
            else:
                tensors = [pb_utils.Tensor("scores", outputs[0][part]), pb_utils.Tensor("label", outputs[1][part])]
            tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, tokens[part]))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def _late_chunks(self, requests: list, parts: list, ids: np.ndarray, lengths: np.ndarray, size: int) -> list:
        """Each text in one pass, its chunks of `size` tokens pooled (late_chunking.py); the engine's refusal (one
        that pools whole sequences only) is every request's."""
        bounds, per_text, kept = self.late.spans(lengths, size)
        try:
            pooled = self.engine.pool_spans(ids, lengths, bounds) if len(lengths) else None
        except (NotImplementedError, ValueError) as exc:
            return [refused(part if isinstance(part, str) else str(exc)) for part in parts]
        self._record(len(requests), lengths)
        span_ends = np.concatenate([[0], np.cumsum(per_text)])
        responses = []
        for part in parts:
            if isinstance(part, str):
                responses.append(refused(part))
                continue
            spans = slice(span_ends[part.start], span_ends[part.stop])
            outputs = self.late.tensors(pooled[spans], per_text[part], kept[spans])
            outputs[TOKENS_OUTPUT] = lengths[part].astype(np.int32).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]))
        return responses

    def _multi_vector(self, requests: list) -> list:
        """A multi-vector model's batch: the requests of each side (their parameter input_type) tokenized and run
        together, each answered with its texts' kept token vectors."""
        responses: list = [None] * len(requests)
        by_side: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            try:
                by_side.setdefault(self.sides.side(request.parameters()), []).append(index)
            except ValueError as exc:
                responses[index] = refused(str(exc))
        for side, indices in by_side.items():
            raws = [pb_utils.get_input_tensor_by_name(requests[index], TEXT_INPUT).as_numpy() for index in indices]
            texts, parts = self.text.gather(raws)
            ids, lengths, attended, kept = self.sides.encode(texts, side)
            vectors = self.engine.forward_packed(ids, lengths, attended) if len(lengths) else None
            self._record(len(indices), lengths)
            token_ends = np.concatenate([[0], np.cumsum(lengths)])
            for index, part in zip(indices, parts, strict=True):
                if isinstance(part, str):
                    responses[index] = refused(part)
                    continue
                tokens = slice(token_ends[part.start], token_ends[part.stop])
                outputs = answer(vectors[tokens], lengths[part], kept[tokens])
                tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
                tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, lengths[part].astype(np.int32).reshape(-1, 1)))
                responses[index] = pb_utils.InferenceResponse(tensors)
        return responses

    def _record(self, requests: int, lengths: np.ndarray) -> None:
        values = tokenizer_counts(requests, lengths)
        if len(lengths):
            values |= encoder_counts(len(lengths), int(lengths.sum()), self.engine.computed_tokens)
        self._metrics.add(values)

    def finalize(self) -> None:
        self._metrics.close()


def refused(message: str):
    """A request's answer when it is refused (the batch's other requests are served)."""
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
