"""SharedBuckets: every tenant's token buckets (requests/s, texts/s) and counters, shared by the processes of
one server on one host.

The fronts run as several processes (the API front's and the HTTP front's workers, the gRPC front's), each of
which sees only part of a tenant's traffic: a per-process bucket would let a tenant through at workers x its
rate. So the buckets live in one small file under /dev/shm (memory, no disk), named from the server's gRPC
port so that two servers on one host keep theirs apart, mapped by every process; a slot is read and written
under an fcntl lock on its own bytes, so tenants never wait for each other. Time is CLOCK_MONOTONIC, which
every process of the host shares.

A slot (SLOT bytes) holds the tenant's name, for each bucket its tokens and when they were last counted, and
the counters /metrics reports: per front, requests and the refusals by status. Slot 0 is the unknown key's (its
401s). A bucket holds at most one second of its rate (at least 1), so a tenant idle for a while may send a
second's worth at once; a request larger than a full bucket passes when the bucket is full and leaves it in
debt, so that a texts/s below a request's size slows a tenant down instead of locking it out.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import struct
import threading
import time
from pathlib import Path

FRONTS = ("api", "http", "grpc")
COUNTS = ("requests", "401", "403", "429")  # per front: requests seen, then refusals by status
NAME_BYTES = 64
_BUCKETS = struct.Struct("<4d")  # request tokens, their time, text tokens, their time
_COUNTERS = struct.Struct(f"<{len(FRONTS) * len(COUNTS)}Q")
_COUNTERS_AT = NAME_BYTES + _BUCKETS.size
SLOT = _COUNTERS_AT + _COUNTERS.size
SLOTS = 1024  # tenants per server, the unknown key's slot included
UNKNOWN = ""  # slot 0: requests with no tenant's key


def shm_path(scope: int, folder: Path = Path("/dev/shm")) -> Path:
    """The buckets of the server whose gRPC port is `scope`."""
    return folder / f"bert-triton-tenants-{scope}"


def refill(tokens: float, last: float, now: float, rate: float) -> float:
    """A bucket's tokens at `now`: what it had plus what `rate` added since `last`, at most one second's worth
    (a bucket never counted, last == 0, is full)."""
    capacity = max(1.0, rate)
    return capacity if last == 0 else min(capacity, tokens + (now - last) * rate)


def take(tokens: float, cost: float, rate: float) -> tuple[float, float]:
    """(tokens left, 0.0) when `cost` may pass, else (tokens unchanged, seconds until it may)."""
    capacity = max(1.0, rate)
    if tokens >= min(cost, capacity):
        return tokens - cost, 0.0
    return tokens, (min(cost, capacity) - tokens) / rate


class SharedBuckets:
    """The buckets and counters at `path`, created (zeroed) by whichever process comes first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < SLOT * SLOTS:
                os.ftruncate(fd, SLOT * SLOTS)  # every process asks for the same size: the race is harmless
            self._map = mmap.mmap(fd, SLOT * SLOTS)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._slots: dict[str, int] = {UNKNOWN: 0}
        self._thread = threading.Lock()  # fcntl locks are per process: threads of one need their own

    def _locked(self, index: int):
        return _SlotLock(self._fd, index, self._thread)

    def slot(self, name: str) -> int:
        """The slot of tenant `name`, claimed on first use (open addressing from the name's hash)."""
        index = self._slots.get(name)
        if index is not None:
            return index
        encoded = name.encode()[:NAME_BYTES].ljust(NAME_BYTES, b"\0")
        start = int.from_bytes(hashlib.sha256(encoded).digest()[:4], "little")
        for step in range(SLOTS - 1):
            index = 1 + (start + step) % (SLOTS - 1)
            with self._locked(index):
                held = self._map[index * SLOT : index * SLOT + NAME_BYTES]
                if held == encoded or held == bytes(NAME_BYTES):
                    self._map[index * SLOT : index * SLOT + NAME_BYTES] = encoded
                    self._slots[name] = index
                    return index
        raise RuntimeError(f"{self.path} has no free slot for tenant {name!r} ({SLOTS - 1} tenants at most)")

    def charge(self, name: str, front: str, requests: int, rps: float, texts: int, tps: float) -> float:
        """Count `requests` for `name` at `front` and take them and `texts` from its buckets (a rate of 0: no
        bucket); 0.0 when they pass, else the seconds until they would (nothing taken, a 429 counted)."""
        index = self.slot(name)
        offset = index * SLOT + NAME_BYTES
        with self._locked(index):
            now = time.monotonic()
            req, req_at, txt, txt_at = _BUCKETS.unpack_from(self._map, offset)
            wait = 0.0
            if rps > 0 and requests:
                req = refill(req, req_at, now, rps)
                req_left, wait = take(req, requests, rps)
            if tps > 0 and texts:
                txt = refill(txt, txt_at, now, tps)
                txt_left, texts_wait = take(txt, texts, tps)
                wait = max(wait, texts_wait)
            if wait == 0.0:
                if rps > 0 and requests:
                    req, req_at = req_left, now
                if tps > 0 and texts:
                    txt, txt_at = txt_left, now
                _BUCKETS.pack_into(self._map, offset, req, req_at, txt, txt_at)
            self._add(index, front, "requests", requests)
            if wait:
                self._add(index, front, "429", 1)
        return wait

    def count(self, name: str, front: str, status: str) -> None:
        """One refusal of `name`'s at `front` (status 401 or 403; 401's name is UNKNOWN)."""
        index = self.slot(name)
        with self._locked(index):
            self._add(index, front, status, 1)

    def _add(self, index: int, front: str, what: str, amount: int) -> None:
        if amount:
            at = index * SLOT + _COUNTERS_AT + 8 * (FRONTS.index(front) * len(COUNTS) + COUNTS.index(what))
            struct.pack_into("<Q", self._map, at, struct.unpack_from("<Q", self._map, at)[0] + amount)

    def counters(self) -> dict[str, dict[tuple[str, str], int]]:
        """Every claimed slot's counters, {tenant: {(front, what): count}}, read without locks (a scrape)."""
        found = {}
        for index in range(SLOTS):
            name = bytes(self._map[index * SLOT : index * SLOT + NAME_BYTES]).rstrip(b"\0")
            if index and not name:
                continue
            values = _COUNTERS.unpack_from(self._map, index * SLOT + _COUNTERS_AT)
            keys = [(front, what) for front in FRONTS for what in COUNTS]
            found[name.decode(errors="replace")] = dict(zip(keys, values, strict=True))
        return found

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class _SlotLock:
    """An exclusive fcntl lock on one slot's bytes (and this process's thread lock) for a `with` block."""

    def __init__(self, fd: int, index: int, thread: threading.Lock) -> None:
        self.fd, self.index, self.thread = fd, index, thread

    def __enter__(self) -> None:
        self.thread.acquire()
        fcntl.lockf(self.fd, fcntl.LOCK_EX, SLOT, self.index * SLOT)

    def __exit__(self, *exc) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, SLOT, self.index * SLOT)
        self.thread.release()


def retry_after(wait_s: float) -> int:
    """A Retry-After in whole seconds, at least 1."""
    return max(1, math.ceil(wait_s))
