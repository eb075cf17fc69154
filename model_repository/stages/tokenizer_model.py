"""Triton Python model `tokenizer` (two-stage topology): text -> token ids + attention mask (a reranker's
(query, text) -> token ids, mask and token types).

Every text of every request in a dynamic batch is tokenized in one call (text_tokenizer.TextTokenizer); a
request over tokenizer.max_text_bytes or max_request_bytes, or with invalid UTF-8, fails with INVALID_ARG
before anything is decoded while the others are served. Each request's rows are padded only to its own
longest text (or its TensorRT bucket); the encoder strips the padding again using the mask.

Custom metrics on Triton's metrics port (labels model, version, model_instance; stage_metrics.py sends them
about once a second):
  bert_tokenizer_requests_total       requests tokenized
  bert_tokenizer_tokens_total         tokens after truncation, special tokens included (per request: divide
                                      by bert_tokenizer_requests_total)
  bert_tokenizer_texts_per_execute    histogram of texts encoded per execute() call (the dynamic batch)
"""

from __future__ import annotations

import gc

import numpy as np
import triton_python_backend_utils as pb_utils

from common.contract import ENGINE_INPUTS, QUERY_INPUT, TEXT_INPUT, TOKEN_TYPES, TOKENS_OUTPUT, ServingSpec
from common.padding import pad_packed

from .model_args import instance_count, model_config
from .parent_watch import exit_with_parent
from .prompts import Prompts
from .stage_metrics import StageMetrics, tokenizer_counts, tokenizer_metrics
from .text_input import TextInput


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        config, params, version_dir = model_config(args)
        self.text = TextInput(version_dir, params, instance_count(config), pb_utils.Logger.log_info)
        self.prompts = Prompts(ServingSpec.load(version_dir))
        self.pad_id = int(params["pad_token_id"])
        self.buckets = [int(b) for b in params.get("pad_to_buckets", "").split(",") if b]
        self.pairs = params.get("pairs") == "true"  # a reranker's (query, text) rows
        # Token types go out where the config declares them: pairs of a model that reads them (BERT's).
        self.send_types = any(output["name"] == TOKEN_TYPES for output in config["output"])
        self._create_metrics(args, int(config["max_batch_size"]))
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        self._metrics = StageMetrics(pb_utils, "tokenizer", args, tokenizer_metrics(max_batch_size))

    def _record(self, requests: int, lengths: np.ndarray) -> None:
        self._metrics.add(tokenizer_counts(requests, lengths))

    def execute(self, requests: list) -> list:
        texts_in = [pb_utils.get_input_tensor_by_name(request, TEXT_INPUT).as_numpy() for request in requests]
        queries_in = (
            [pb_utils.get_input_tensor_by_name(r, QUERY_INPUT).as_numpy() for r in requests] if self.pairs else None
        )
        parts, ids, lengths, types = self.text.tokenize(texts_in, queries_in, self.prompts.of(requests))
        self._record(len(requests), lengths)
        starts = np.cumsum(lengths) - lengths
        tokens = lengths.astype(np.int32).reshape(-1, 1)
        responses = []
        for part in parts:
            if isinstance(part, str):
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(part, pb_utils.TritonError.INVALID_ARG))
                )
                continue
            padded, mask = pad_packed(ids, lengths[part], self.pad_id, self.buckets, starts[part])
            tensors = [pb_utils.Tensor(name, array) for name, array in zip(ENGINE_INPUTS, (padded, mask), strict=True)]
            if self.send_types:
                padded_types = pad_packed(types, lengths[part], 0, self.buckets, starts[part])[0]
                tensors.append(pb_utils.Tensor(TOKEN_TYPES, padded_types))
            tensors.append(pb_utils.Tensor(TOKENS_OUTPUT, tokens[part]))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def finalize(self) -> None:
        self._metrics.close()
