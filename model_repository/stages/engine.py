"""The small interface every encoder engine implements, and how the encoder stage picks one.

This folder is copied flat into the generated model version directories, which Triton's Python backend
puts on sys.path; stage modules therefore import each other by bare module name.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SERVING_FILE = "serving.json"


@dataclass(frozen=True)
class ServingSpec:
    """What `export` recorded about the model: task, pooling and output layout."""

    task: str  # embedding | classification
    pooling: str  # mean | cls | max | mean_sqrt_len (embedding only)
    normalize: bool  # L2-normalize pooled embeddings
    hidden_size: int
    output_size: int  # embedding width or number of labels
    labels: tuple[str, ...]  # classification labels by class index
    max_tokens: int
    pad_token_id: int

    @classmethod
    def load(cls, model_dir: Path) -> ServingSpec:
        raw = json.loads((Path(model_dir) / SERVING_FILE).read_text())
        return cls(**{**raw, "labels": tuple(raw["labels"])})

    def save(self, model_dir: Path) -> None:
        data = {**self.__dict__, "labels": list(self.labels)}
        (Path(model_dir) / SERVING_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @property
    def output_name(self) -> str:
        return "embedding" if self.task == "embedding" else "logits"


class Engine(ABC):
    """Runs the encoder and the task head on whole batches of unpadded token sequences.

    `forward` takes one int32 array of token ids per sequence (lengths differ, no padding) and returns
    one float32 row per sequence: the pooled (and, per the spec, normalized) embedding, or the logits.
    How the batch is laid out (padded buckets, packed tokens) is the engine's own business.
    """

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        self.model_dir = Path(model_dir)
        self.spec = spec
        self.device = device
        self.options = options
        # Token positions the last forward() computed, its own padding included (for the padding metric).
        self.computed_tokens = 0

    @abstractmethod
    def forward(self, sequences: list[np.ndarray]) -> np.ndarray: ...


def load_engine(kind: str, model_dir: Path, device: str = "cpu", options: dict | None = None) -> Engine:
    """Imports engine_<kind>.py and builds its `ENGINE` class for the exported model in model_dir."""
    module = importlib.import_module(f"engine_{kind}")
    spec = ServingSpec.load(model_dir)
    return module.ENGINE(model_dir, spec, device, options or {})
