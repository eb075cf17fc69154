"""Triton Python model `encoder`: token ids + mask -> one pooled embedding (or logits) row per text.

Requests of different lengths arrive in one execute() call (allow_ragged_batch); each row is cut back to
its own length and the engine gets the unpadded sequences of the whole dynamic batch at once.

Custom metrics on Triton's metrics port (labels model, version, model_instance), at most three updates per execute():
  bert_encoder_sequences_per_execute  histogram of sequences per execute() call: the engine's batch size
  bert_encoder_real_tokens_total      tokens of the sequences themselves
  bert_encoder_padded_tokens_total    tokens the engine computed, its own padding included (Engine.computed_tokens:
                                      onnxruntime_cpu's per-chunk padding, torch_gpu's CUDA-graph bucket tails);
                                      padded / real is the work spent per real token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from engine import load_engine
from stage_metrics import StageMetrics, power_of_two_buckets


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        device = "cpu"
        if args["model_instance_kind"] == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
        version_dir = Path(args["model_repository"]) / args["model_version"]
        options = {key: value for key, value in params.items() if key != "engine_kind"}
        self.engine = load_engine(params["engine_kind"], version_dir, device, options)
        self.output_name = self.engine.spec.output_name
        self._create_metrics(args, int(config["max_batch_size"]))

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        self._metrics = StageMetrics(
            pb_utils,
            "encoder",
            args,
            {
                "bert_encoder_sequences_per_execute": (
                    "Sequences per execute() call (the engine's batch size)",
                    "histogram",
                    power_of_two_buckets(max_batch_size),
                ),
                "bert_encoder_real_tokens_total": ("Tokens of the encoded sequences", "counter", None),
                "bert_encoder_padded_tokens_total": (
                    "Tokens the engine computed, its padding included",
                    "counter",
                    None,
                ),
            },
        )

    def _record(self, sequences: int, real_tokens: int) -> None:
        self._metrics.update(
            {
                "bert_encoder_sequences_per_execute": sequences,
                "bert_encoder_real_tokens_total": real_tokens,
                "bert_encoder_padded_tokens_total": self.engine.computed_tokens,
            }
        )

    def execute(self, requests: list) -> list:
        sequences: list[np.ndarray] = []
        counts: list[int] = []
        real_tokens = 0
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            lengths = mask.sum(axis=1)
            sequences.extend(ids[row, :length] for row, length in enumerate(lengths))
            counts.append(len(ids))
            real_tokens += int(lengths.sum())
        outputs = self.engine.forward(sequences)
        self._record(len(sequences), real_tokens)
        responses = []
        start = 0
        for count in counts:
            rows = outputs[start : start + count]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, rows)]))
            start += count
        return responses

    def finalize(self) -> None:
        self._metrics.close()
