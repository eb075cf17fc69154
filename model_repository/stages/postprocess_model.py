"""Triton Python model `postprocess` (two-stage classification): logits -> softmax scores and label names."""

from __future__ import annotations

import gc
from pathlib import Path

import triton_python_backend_utils as pb_utils

from common.contract import ServingSpec

from .classification import label_array, scores_and_labels
from .parent_watch import exit_with_parent


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a killed tritonserver leaves no stub behind (parent_watch.py)
        spec = ServingSpec.load(Path(args["model_repository"]) / args["model_version"])
        self.labels = label_array(spec.labels)
        gc.freeze()  # what loading made lives on: later collections need not scan it

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            scores, labels = scores_and_labels(logits, self.labels)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("scores", scores), pb_utils.Tensor("label", labels)])
            )
        return responses
