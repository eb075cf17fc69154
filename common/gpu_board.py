"""GpuBoard: what the stubs of one server and its API front tell each other, through one small shared-memory file,
so that queries come first without getting a smaller pipe (docs/api.md, Priority).

- A stub of a model's own instances marks its slot while it runs a batch that holds ingestion, and stamps the
  time it last did. The API front sends a query to the query lane only while some stub ingests (or did within
  LINGER_S): with queries alone, every instance of the model serves them.
- A query lane's stub marks its slot while it holds queries. The model's stubs on that GPU then launch no new
  ingestion chunk (model_repository/stages/gpu_turns.py), so a query waits for the chunks already on the GPU.
- A model's stub marks its slot while its ingestion chunk is on the GPU, so that the stubs can bound how many run.

The file holds SLOTS slots: a state byte, the slot's GPU and the time of its last ingestion. A process claims a free
slot for its life with a POSIX lock on one byte past the data, which the kernel drops when the process dies; the
claim clears the slot. Each write is one aligned field of the process's own slot, so readers never see it torn;
the bounds are soft (two stubs may pass one check at once). The launcher names the file in BOARD_ENVIRONMENT.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from pathlib import Path

import numpy as np

BOARD_ENVIRONMENT = "BERT_TRITON_GPU_BOARD"  # the file's path, in tritonserver's (so the stubs') environment
SLOTS = 256
INGESTING, QUERYING, ON_GPU = 1, 2, 4  # state bits
LINGER_S = 0.02  # ingestion seen this recently still sends queries to the lane: a stub between two batches
_STATE, _GPU, _SEEN = 0, SLOTS, 2 * SLOTS  # offsets: uint8[SLOTS], uint8[SLOTS], float64[SLOTS]
_SIZE = _SEEN + 8 * SLOTS
_LOCKS = 4096  # slot i's lock: byte _LOCKS + i (past the data, which locks do not touch)


class GpuBoard:
    """One server's board; `claim()` gives this process a slot of its own to write."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < _SIZE:
            os.ftruncate(self._fd, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE)
        self._state = np.frombuffer(self._map, np.uint8, SLOTS, _STATE)
        self._gpu = np.frombuffer(self._map, np.uint8, SLOTS, _GPU)
        self._seen = np.frombuffer(self._map, np.float64, SLOTS, _SEEN)
        self.slot: int | None = None

    @classmethod
    def from_environment(cls) -> GpuBoard | None:
        """The board the launcher made for this server, or None (a tritonserver started without the launcher)."""
        path = os.environ.get(BOARD_ENVIRONMENT)
        return cls(path) if path else None

    def claim(self, gpu: int) -> GpuBoard:
        """A free slot for this process, on `gpu`; every free slot is cleared, so what a dead stub left is gone."""
        for slot in range(SLOTS):
            if not self._lock(slot):
                continue
            if self.slot is None:
                self.slot = slot
                self._gpu[slot] = gpu
            else:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _LOCKS + slot)
            self._state[slot], self._seen[slot] = 0, 0.0
        if self.slot is None:
            raise RuntimeError(f"every one of the {SLOTS} slots of {self.path} is held")
        return self

    def _lock(self, slot: int) -> bool:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _LOCKS + slot)
        except OSError:
            return False
        return True

    def mark(self, bits: int) -> None:
        self._state[self.slot] = bits

    def stamp(self) -> None:
        """This slot ingested just now."""
        self._seen[self.slot] = time.monotonic()

    def ingesting(self) -> bool:
        """Whether any stub runs ingestion, or did within LINGER_S."""
        return bool((self._state & INGESTING).any()) or bool((self._seen > time.monotonic() - LINGER_S).any())

    def count(self, bit: int, gpu: int) -> int:
        """How many slots on `gpu` have `bit` set."""
        return int(np.count_nonzero((self._state & bit).astype(bool) & (self._gpu == gpu)))

    def close(self) -> None:
        self._state = self._gpu = self._seen = None  # the views go before the map they read
        self._map.close()
        os.close(self._fd)  # drops the slot's lock
