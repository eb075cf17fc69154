"""The one small interface every engine implements (Engine.forward_packed), and the packed layout it takes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.contract import ServingSpec


class Engine(ABC):
    """Runs the encoder and the task head on whole batches of unpadded token sequences.

    `forward_packed` takes every sequence's token ids one after another (int32 [total tokens]) with each
    sequence's length (int64 [sequences]), no padding, and for a model of (query, text) pairs each token's
    type beside its id (int32 [total tokens]: 0 query, 1 text); it returns one float32 row per sequence: the
    pooled (and, per the spec, normalized) embedding, or the logits; for a sparse model a sparse.SparseRows
    (every sequence's non-zero vocabulary entries, packed); for a hybrid model hybrid.HybridRows, of
    which only the `wanted` outputs (HYBRID_GRAPH_OUTPUTS' names; None: all) are copied out. A multi-vector model
    takes each token's attention flag as `types` and gives one row per token that `kept` marks (bool [total
    tokens]; None: every token), packed in token order: only those rows leave the device. How the batch is laid
    out for the model (padded chunks, packed tokens) is the engine's own business.
    """

    kind = "?"  # its ENGINES name, for messages
    # Whether it queues calls and runs the query lane's before the others itself: a stub then hands it every chunk
    # of a batch at once (stage_core.py) and waits for no GPU turn (gpu_turns.py).
    queries_first = False

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        self.model_dir = Path(model_dir)
        self.spec = spec
        self.device = device
        self.options = options
        # Token positions the last forward() computed, its own padding included (for the padding metric).
        self.computed_tokens = 0

    @abstractmethod
    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
                       wanted: frozenset[str] | None = None, kept: np.ndarray | None = None): ...  # fmt: skip

    @property
    def launches_ahead(self) -> bool:
        """Whether submit() returns before the batch is done (torch on a GPU), so that the caller can prepare or
        launch the next one meanwhile; this one computes it at once."""
        return False

    def submit(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
               wanted: frozenset[str] | None = None,
               kept: np.ndarray | None = None) -> Callable[[], object]:  # fmt: skip
        """forward_packed begun: a callable that returns its outputs (see launches_ahead)."""
        outputs = self.forward_packed(ids, lengths, types, wanted, kept)
        return lambda: outputs

    def pool_spans(self, ids: np.ndarray, lengths: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """Late chunking: the sequences in one pass, then each span [bounds[i], bounds[i + 1]) of the packed token
        stream (bounds: int [spans + 1], from 0 to every token) mean-pooled and, as the spec says, normalized: fp32
        [spans, hidden]. An engine that pools whole sequences only refuses it."""
        raise NotImplementedError(f"late chunking pools spans of the token states: engine {self.kind} pools whole "
                                  "sequences only; engine kind torch pools spans")  # fmt: skip

    def forward(self, sequences: list[np.ndarray], types: list[np.ndarray] | None = None):
        """forward_packed for a list of sequences, one int array each, and their token types (tests, benchmarks)."""
        ids, lengths = pack_sequences(sequences)
        return self.forward_packed(ids, lengths, None if types is None else pack_sequences(types)[0])


def pack_sequences(sequences: list) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths), the packed layout of Engine.forward_packed, of a list of token sequences."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    if not len(sequences):
        return np.zeros(0, dtype=np.int32), lengths
    return np.concatenate([np.asarray(row, dtype=np.int32) for row in sequences]), lengths
