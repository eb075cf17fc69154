"""The small interface every encoder engine implements, and how the encoder stage picks one.

This package is copied whole into each generated model version directory as `stages/` (Triton's Python
backend puts that directory on sys.path, so model.py imports `stages.<stage>`); its modules import each
other relatively, so here they are `model_repository.stages.*` and there `stages.*`, one name in each process.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from common.contract import OPTION_PREFIX, ServingSpec


class Engine(ABC):
    """Runs the encoder and the task head on whole batches of unpadded token sequences.

    `forward_packed` takes every sequence's token ids one after another (int32 [total tokens]) with each
    sequence's length (int64 [sequences]), no padding, and returns one float32 row per sequence: the pooled
    (and, per the spec, normalized) embedding, or the logits. How the batch is laid out for the model (padded
    chunks, packed tokens) is the engine's own business.
    """

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        self.model_dir = Path(model_dir)
        self.spec = spec
        self.device = device
        self.options = options
        # Token positions the last forward() computed, its own padding included (for the padding metric).
        self.computed_tokens = 0

    @abstractmethod
    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray: ...

    def forward(self, sequences: list[np.ndarray]) -> np.ndarray:
        """forward_packed for a list of sequences, one int array each (tests, benchmarks)."""
        return self.forward_packed(*pack_sequences(sequences))


def pack_sequences(sequences: list) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths), the packed layout of Engine.forward_packed, of a list of token sequences."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    if not len(sequences):
        return np.zeros(0, dtype=np.int32), lengths
    return np.concatenate([np.asarray(row, dtype=np.int32) for row in sequences]), lengths


def load_engine(kind: str, model_dir: Path, device: str = "cpu", options: dict | None = None) -> Engine:
    """Imports engine_<kind>.py and builds its `ENGINE` class for the exported model in model_dir."""
    module = importlib.import_module(f".engine_{kind}", __package__)
    spec = ServingSpec.load(model_dir)
    return module.ENGINE(model_dir, spec, device, options or {})


def engine_from_args(args: dict, params: dict) -> Engine:
    """The engine a stage instance runs: kind and options from its config's parameters (engine_kind, precision,
    threads, and the settings' [engine] options as "engine.<name>"), device from the instance."""
    device = "cpu"
    if args["model_instance_kind"] == "GPU":
        device = f"cuda:{args['model_instance_device_id']}"
    version_dir = Path(args["model_repository"]) / args["model_version"]
    options = {key: params[key] for key in ("precision", "threads") if key in params}
    options.update(
        {key.removeprefix(OPTION_PREFIX): value for key, value in params.items() if key.startswith(OPTION_PREFIX)}
    )
    return load_engine(params["engine_kind"], version_dir, device, options)
