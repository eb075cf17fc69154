"""A request's deadline in the stage (the API front's parameter deadline_ns, CLOCK_MONOTONIC): refused unrun once it
has passed, or, in turns on a GPU (gpu_turns.py), once it will pass before its chunk can finish.

How soon a chunk can finish is learned in the stub itself: the fewest seconds per text among its last WINDOW chunks,
times the chunk's texts. That is the engine's best recent pace, so the estimate errs early: a request refused on it
would have been answered after its deadline, when the front has already answered it 504, and the GPU time it would
have taken goes to requests still waited for."""

from __future__ import annotations

import collections

WINDOW = 32  # chunks remembered: enough to hold a large one among the small ones that follow it


class Pace:
    """One stub's recent seconds per text, launch to collect."""

    def __init__(self, window: int = WINDOW) -> None:
        self._per_text: collections.deque[float] = collections.deque(maxlen=window)

    def observe(self, texts: int, seconds: float) -> None:
        if texts > 0:
            self._per_text.append(seconds / texts)

    def soonest_s(self, texts: int) -> float:
        """The least time a chunk of `texts` texts has taken of late (0 before any)."""
        return min(self._per_text, default=0.0) * texts


def expired(deadline: float, at: float) -> bool:
    """Whether a request with this deadline (time.monotonic(); 0: none) is past it at time `at`."""
    return bool(deadline) and deadline <= at
