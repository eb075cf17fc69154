"""A request's deadline in the stage (the API front's parameter deadline_ns, CLOCK_MONOTONIC): refused unrun once it
has passed, or once it will pass before its chunk can finish (in turns on a GPU, gpu_turns.py, a piece of the
batch; elsewhere the whole batch).

How soon a chunk can finish is learned in the stub itself, from its last WINDOW chunks: the fewest seconds per text
times the chunk's texts, and no less than the quickest recent chunk of at most as many texts took, since a chunk
has a cost of its own whatever its texts. By the pace per text alone, a one-text query beside 64-text chunks was
given 26 us (batch 64 at 39k seq/s on an H200) where batch 1 takes 0.54 ms. The estimate still errs early: a
request refused on it would have been answered after its deadline, when the front has already answered it 504, and
the GPU time it would have taken goes to requests still waited for."""

from __future__ import annotations

import collections

WINDOW = 32  # chunks remembered: enough to hold a large one among the small ones that follow it


class Pace:
    """One stub's recent chunks, launch to collect."""

    def __init__(self, window: int = WINDOW) -> None:
        self._chunks: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)  # (texts, seconds)

    def observe(self, texts: int, seconds: float) -> None:
        if texts > 0:
            self._chunks.append((texts, seconds))

    def soonest_s(self, texts: int) -> float:
        """The least time a chunk of `texts` texts can take, by its recent ones (0 before any)."""
        per_text = min((seconds / size for size, seconds in self._chunks), default=0.0) * texts
        smaller = min((seconds for size, seconds in self._chunks if size <= texts), default=0.0)
        # ... but no more than a chunk of as many texts or more took: a slow small chunk since overtaken
        larger = min((seconds for size, seconds in self._chunks if size >= texts), default=smaller)
        return max(per_text, min(smaller, larger))


def expired(deadline: float, at: float) -> bool:
    """Whether a request with this deadline (time.monotonic(); 0: none) is past it at time `at`."""
    return bool(deadline) and deadline <= at
