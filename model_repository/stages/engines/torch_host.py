"""The host side of a batch the torch engine has on a GPU: its pinned input and output buffers and the event that
says the GPU is done with both. The engine keeps one per batch that may be in flight at once (TorchEngine.launch)."""

from __future__ import annotations

import time

import numpy as np
import torch


class HostSlot:
    def __init__(self, ids_capacity: int, rows_capacity: int, width: int) -> None:
        self.host_in = torch.empty(ids_capacity, dtype=torch.int32, pin_memory=True)
        self.host_out = torch.empty((rows_capacity, width), dtype=torch.float32, pin_memory=True)
        self.done = torch.cuda.Event(blocking=True)
        self.pending = False

    def buffers(self, ids_size: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(pinned ids, pinned rows) large enough for this batch, grown where it is larger than any before."""
        if ids_size > self.host_in.numel():
            self.host_in = torch.empty(ids_size, dtype=torch.int32, pin_memory=True)
        if rows > self.host_out.shape[0]:
            self.host_out = torch.empty((rows, self.host_out.shape[1]), dtype=torch.float32, pin_memory=True)
        return self.host_in, self.host_out

    def record(self, stream: torch.cuda.Stream) -> None:
        """After the batch's last copy on `stream`."""
        self.done.record(stream)
        self.pending = True

    def wait(self, spin_s: float) -> None:
        """Until the GPU is done with this slot's batch: poll for up to spin_s (< 0: to the end), then sleep on the
        blocking-sync event. Polling answers a short batch without a wake-up; sleeping frees the core."""
        if not self.pending:
            return
        self.pending = False
        if spin_s < 0:
            while not self.done.query():
                pass
            return
        deadline = time.perf_counter() + spin_s
        while not self.done.query():
            if time.perf_counter() >= deadline:
                self.done.synchronize()
                return

    def rows(self, n: int, spin_s: float) -> np.ndarray:
        """The batch's n rows, once the GPU has written them."""
        self.wait(spin_s)
        return self.host_out[:n].numpy().copy()
