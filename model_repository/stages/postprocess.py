"""Triton Python model `postprocess` (classification): logits -> softmax scores and label names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from engine import ServingSpec


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        spec = ServingSpec.load(Path(args["model_repository"]) / args["model_version"])
        self.labels = np.array([label.encode() for label in spec.labels], dtype=object)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy().astype(np.float32)
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = shifted / shifted.sum(axis=1, keepdims=True)
            labels = self.labels[scores.argmax(axis=1)].reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("scores", scores), pb_utils.Tensor("label", labels)])
            )
        return responses
