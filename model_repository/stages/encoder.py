"""Triton Python model `encoder`: token ids + mask -> one pooled embedding (or logits) row per text.

Requests of different lengths arrive in one execute() call (allow_ragged_batch); each row is cut back to
its own length and the engine gets the unpadded sequences of the whole dynamic batch at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from engine import load_engine


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

    def execute(self, requests: list) -> list:
        sequences: list[np.ndarray] = []
        counts: list[int] = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            lengths = mask.sum(axis=1)
            sequences.extend(ids[row, :length] for row, length in enumerate(lengths))
            counts.append(len(ids))
        outputs = self.engine.forward(sequences)
        responses = []
        start = 0
        for count in counts:
            rows = outputs[start : start + count]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, rows)]))
            start += count
        return responses
