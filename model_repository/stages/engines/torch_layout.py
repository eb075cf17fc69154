"""The packed batch of the torch engine: one int32 buffer per batch, and the buckets graphs are kept for.

Layout of one batch of `seqs` sequence slots and `tokens` token slots (a CUDA-graph bucket is larger than
the batch it runs; its tail tokens belong to no sequence):
  ids [tokens] | cu_seqlens [seqs + 1] | tile_seq [cap] | tile_m [cap] [| key lengths [seqs + 1]]
The tile arrays drive the Triton attention kernel (one program per BLOCK_M query rows of one sequence);
block_m = 0 means another attention and no tiles. A keyed layout (a multi-vector model's) adds how many of each
sequence's first tokens are keys, 0 for the empty slots and the tail, so that a CUDA graph reads them from its
static buffer as it reads cu_seqlens.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from common.padding import plan_chunks

# A pair model's packed ids carry each token's type in their top bits (id | type << TYPE_SHIFT), so the one
# int32 stream, its graphs and its copies stay as they are; the embedding splits them again.
TYPE_SHIFT = 24
ID_MASK = (1 << TYPE_SHIFT) - 1


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tile_cap(tokens: int, seqs: int, block_m: int) -> int:
    """Query tiles a batch of this size can need at most (each sequence adds at most one partial tile)."""
    return seqs + tokens // block_m + 1 if block_m else 0


def layout_size(tokens: int, seqs: int, block_m: int, keyed: bool = False) -> int:
    """int32 words of one packed batch."""
    return tokens + (seqs + 1) * (2 if keyed else 1) + 2 * tile_cap(tokens, seqs, block_m)


def token_bucket(tokens: int, buckets_per_octave: int) -> int:
    """The token count of the graph bucket that holds `tokens`: buckets_per_octave steps per power of two."""
    if tokens <= 64:
        return 64
    shift = max(6, tokens.bit_length() - 1 - max(0, buckets_per_octave.bit_length() - 1))
    granule = 1 << shift
    return -(-tokens // granule) * granule


def length_class(max_len: int, tiled: bool, max_positions: int) -> int:
    """The longest sequence a graph is captured for (the tiled Triton attention needs none: 0)."""
    if tiled:
        return 0
    return 128 if max_len <= 128 else min(next_pow2(max_len), max(max_positions, max_len))


def pack(buf: np.ndarray, ids: np.ndarray, lens: np.ndarray, tokens: int, seqs: int, block_m: int, keys=None) -> None:
    """Writes one packed batch into buf (layout_size(tokens, seqs, block_m, keys is not None) words): ids, then the
    bucket's tail; keys: each sequence's key length (a keyed layout)."""
    n = len(lens)
    total = len(ids)
    buf[:total] = ids
    buf[total:tokens] = 0
    cu = buf[tokens : tokens + seqs + 1]
    cu[0] = 0
    cu[1 : n + 1] = np.cumsum(lens)
    cu[n + 1 :] = total
    cap = tile_cap(tokens, seqs, block_m)
    if cap:
        per = (lens + block_m - 1) // block_m
        n_tiles = int(per.sum())
        tile_seq = buf[tokens + seqs + 1 : tokens + seqs + 1 + cap]
        tile_m = buf[tokens + seqs + 1 + cap : tokens + seqs + 1 + 2 * cap]
        tile_seq[:n_tiles] = np.repeat(np.arange(n, dtype=np.int32), per)
        tile_seq[n_tiles:] = -1
        first = np.cumsum(per) - per
        tile_m[:n_tiles] = (np.arange(n_tiles) - np.repeat(first, per)) * block_m
        tile_m[n_tiles:] = 0
    if keys is not None:
        key_lens = buf[tokens + seqs + 1 + 2 * cap : tokens + 2 * (seqs + 1) + 2 * cap]
        key_lens[:n] = keys
        key_lens[n:] = 0


def views(dev: torch.Tensor, tokens: int, seqs: int, block_m: int):
    """(ids, cu_seqlens, (tile_seq, tile_m) or None) over a packed batch on the device."""
    cap = tile_cap(tokens, seqs, block_m)
    ids = dev[:tokens]
    cu = dev[tokens : tokens + seqs + 1]
    tiles = None
    if cap:
        o = tokens + seqs + 1
        tiles = (dev[o : o + cap], dev[o + cap : o + 2 * cap])
    return ids, cu, tiles


def key_view(dev: torch.Tensor, tokens: int, seqs: int, block_m: int) -> torch.Tensor:
    """The key lengths [seqs + 1] of a keyed packed batch on the device."""
    o = tokens + seqs + 1 + 2 * tile_cap(tokens, seqs, block_m)
    return dev[o : o + seqs + 1]


def cpu_chunks(lens: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(gather, real, targets) per chunk of the length-sorted batch (padding.plan_chunks): the packed row each
    grid slot reads, which slots are real, and the packed rows the real slots' results go to. A padding slot
    reads its sequence's first token: it is no key, and its own result is dropped, so it needs no zero row (a
    copy of the whole projection per layer)."""
    starts = np.cumsum(lens) - lens
    order = np.argsort(lens, kind="stable")
    chunks = []
    for start, stop in plan_chunks(lens[order]):
        rows = order[start:stop]
        positions = np.arange(int(lens[rows].max()))
        real = positions[None, :] < lens[rows][:, None]
        gather = starts[rows][:, None] + np.where(real, positions[None, :], 0)
        chunks.append(tuple(torch.from_numpy(a) for a in (gather.reshape(-1), real, gather[real])))
    return chunks


def token_parts(lens: np.ndarray, budget: int) -> list[np.ndarray]:
    """The rows of a batch in length order, split into parts of at most `budget` tokens (a longer row is a part
    of its own): the CPU path's unit of work, small enough for the cores' caches."""
    order = np.argsort(lens, kind="stable")
    ends = np.cumsum(lens[order])
    parts, start = [], 0
    while start < len(order):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + budget, side="right")))
        parts.append(order[start:stop])
        start = stop
    return parts


def key_lengths(lengths: np.ndarray, attended: np.ndarray | None) -> np.ndarray:
    """Each sequence's key length from its tokens' attended flags (None: all attended); ValueError where a
    sequence's unattended tokens are not its last ones, or are all of it."""
    if attended is None:
        return lengths
    starts = np.cumsum(lengths) - lengths
    counted = np.concatenate([[0], np.cumsum(attended != 0)])
    keys = counted[starts + lengths] - counted[starts]
    places = np.arange(len(attended)) - np.repeat(starts, lengths)
    if not np.array_equal(attended != 0, places < np.repeat(keys, lengths)):
        raise ValueError("a sequence's unattended tokens must be its last ones")
    if (keys[lengths > 0] == 0).any():
        raise ValueError("a sequence attends to none of its tokens")
    return keys


class HostSlot:
    """One CUDA batch's pinned host buffers (its packed ids in, the positions of the token rows it keeps, its rows
    out) and the event after its copies."""

    def __init__(self, cap: int, rows: int, width: int, dtype: torch.dtype) -> None:
        self.host_in = torch.empty(cap, dtype=torch.int32, pin_memory=True)
        self.host_index = torch.empty(rows, dtype=torch.int64, pin_memory=True)
        self.host_out = torch.empty((rows, width), dtype=dtype, pin_memory=True)
        self.done = torch.cuda.Event(blocking=True)
        self.pending = False

    def index_on(self, kept: np.ndarray, device: torch.device) -> torch.Tensor:
        """The positions of the kept rows (bool [rows]), copied to the device on the current stream through this
        slot's pinned buffer (wait() first: its last batch's copies are done)."""
        where = np.flatnonzero(kept)
        if len(where) > self.host_index.numel():
            self.host_index = torch.empty(len(where), dtype=torch.int64, pin_memory=True)
        staged = self.host_index[: len(where)]
        staged.numpy()[:] = where
        return staged.to(device, non_blocking=True)

    def sized(self, size: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers, grown to hold `size` packed int32 and `rows` rows."""
        if size > self.host_in.numel():
            self.host_in = torch.empty(size, dtype=torch.int32, pin_memory=True)
        if rows > self.host_out.shape[0]:
            self.host_out = torch.empty((rows, self.host_out.shape[1]), dtype=self.host_out.dtype, pin_memory=True)
        return self.host_in, self.host_out

    def record(self, stream) -> None:
        self.done.record(stream)
        self.pending = True

    def wait(self, spin_s: float) -> None:
        """Until the work recorded is done: poll for up to spin_s (< 0: to the end), then sleep on the blocking-sync
        event (the GIL released). Polling answers a short batch without a wake-up."""
        if not self.pending:
            return
        deadline = time.perf_counter() + spin_s
        while not self.done.query():
            if spin_s >= 0 and time.perf_counter() >= deadline:
                self.done.synchronize()
                break
        self.pending = False
