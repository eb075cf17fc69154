"""The classification head's last step, shared by postprocess_model and pipeline_model: logits -> scores, label."""

from __future__ import annotations

import numpy as np


def label_array(labels: tuple[str, ...]) -> np.ndarray:
    """Label names as the TYPE_STRING array the heads index into."""
    return np.array([label.encode() for label in labels], dtype=object)


def scores_and_labels(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax scores [rows, classes] (float32) and each row's most likely label [rows, 1]."""
    logits = logits.astype(np.float32, copy=False)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    scores = shifted / shifted.sum(axis=1, keepdims=True)
    return scores, labels[scores.argmax(axis=1)].reshape(-1, 1)
