"""Triton Python model `encoder` (two-stage topology): token ids + mask -> one pooled embedding (or logits)
row per text.

Requests of different lengths arrive in one execute() call (allow_ragged_batch); each request's padding is
dropped using its mask and the engine gets the packed ids of the whole dynamic batch at once.

Custom metrics on Triton's metrics port (labels model, version, model_instance; sent about once a second):
  bert_encoder_sequences_per_execute  histogram of sequences per execute() call: the engine's batch size
  bert_encoder_real_tokens_total      tokens of the sequences themselves
  bert_encoder_padded_tokens_total    tokens the engine computed, its own padding included (Engine.computed_tokens:
                                      onnxruntime_cpu's per-chunk padding, the torch engine's CUDA-graph bucket tails);
                                      padded / real is the work spent per real token.
"""

from __future__ import annotations

import gc

import numpy as np
import triton_python_backend_utils as pb_utils

from common.contract import ENGINE_INPUTS, TOKEN_TYPES
from common.padding import unpad

from .model_args import engine_from_args, model_config
from .parent_watch import exit_with_parent
from .stage_metrics import StageMetrics, encoder_counts, encoder_metrics


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        config, params, _ = model_config(args)
        self.engine = engine_from_args(args, params, pb_utils.Logger.log_info)
        self.output_name = self.engine.spec.output_name
        self._create_metrics(args, int(config["max_batch_size"]))
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        self._metrics = StageMetrics(pb_utils, "encoder", args, encoder_metrics(max_batch_size))

    def _record(self, sequences: int, real_tokens: int) -> None:
        self._metrics.add(encoder_counts(sequences, real_tokens, self.engine.computed_tokens))

    def execute(self, requests: list) -> list:
        packed, types = [], []
        for request in requests:
            ids, mask = (pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in ENGINE_INPUTS)
            packed.append(unpad(ids, mask))
            if TOKEN_TYPES in self.engine.spec.engine_inputs:  # a BERT pair's token types, laid out as its ids
                types.append(unpad(pb_utils.get_input_tensor_by_name(request, TOKEN_TYPES).as_numpy(), mask)[0])
        ids = np.concatenate([part[0] for part in packed])
        lengths = np.concatenate([part[1] for part in packed])
        outputs = self.engine.forward_packed(ids, lengths, np.concatenate(types) if types else None)
        self._record(len(lengths), len(ids))
        responses = []
        start = 0
        for _, request_lengths in packed:
            stop = start + len(request_lengths)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, outputs[start:stop])]))
            start = stop
        return responses

    def finalize(self) -> None:
        self._metrics.close()
