"""One engine process for every stub of a model on one device: their calls run as shared batches.

Why: a served model's 8 stubs on a GPU are 8 CUDA contexts, each running the few texts Triton hands it, and the GPU
time-slices them. On an H100 (docs/results/h100/2026-12-07-e/, bench.shared_engine), 8 processes calling with 8
texts each ran 12.9k sequences/s on contexts of their own and 30.0k through one process that batched their calls.

The stubs call it through engines/shared.py over a Unix stream socket, one call after another on a connection:
CALL (sequences, tokens, flags), then lengths (int64), ids (int32) and, with FLAG_TYPES, types (int32). Each call is
answered in order: ANSWER (status, rows, width, bytes that follow); status 0: float32 rows [rows, width]; 1: a UTF-8
message (the call failed; the next ones go on).

A CALL flagged FLAG_STATS (no arrays follow) is answered at once with status 2 and the process's counters so far as
JSON (Stats), on a connection with no call in flight: bench/process_cpu.py asks so, and each stub as it connects, to
know the process is not hung.

Scheduling: the waiting calls flagged FLAG_QUERY (the query lane's stubs) run first, as a batch of their own; else
the waiting calls in arrival order, up to `max_tokens` tokens (at least one call). While queries come (one arrived
within QUERIES_COME_S), an ingestion batch also takes at most `texts_beside_queries` sequences (the stubs' chunk,
priority.ingestion_chunk_texts), so that a query waits at most for one such batch in flight and one launched, as
beside stubs with engines of their own (gpu_turns.py); alone, ingestion batches as large as it can. The next batch
is launched before the last one's rows are sent, so the device is not idle while they are (where the engine launches
ahead: a CPU engine computes in submit(), and its rows are sent at once). The process ends when
the process named by --parent-pid (tritonserver) has.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

from common.contract import ENGINE_PROCESS_PREFIX as PREFIX
from common.process_state import running

CALL = struct.Struct("<IIII")  # sequences, tokens, flags, reserved
ANSWER = struct.Struct("<IIII")  # status, rows, width, bytes that follow
FLAG_QUERY = 1
FLAG_TYPES = 2
FLAG_STATS = 4
STATUS_STATS = 2
SUFFIXES = (".sock", ".ready", ".lock", ".log")
# Since the last query, ingestion batches stay small this long: queries at 50/s come every 20 ms, and the launcher's
# canary, one to the lane every server.canary_interval_s (5 s), bounds 2 % of the time.
QUERIES_COME_S = 0.1


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if not count:
            raise ConnectionError("the other end closed the connection")
        got += count
    return bytes(data)


class Call:
    """One stub's call, as received."""

    __slots__ = ("conn", "ids", "lengths", "query", "types")

    def __init__(self, conn: socket.socket, lengths: np.ndarray, ids: np.ndarray, types, query: bool) -> None:
        self.conn, self.lengths, self.ids, self.types, self.query = conn, lengths, ids, types, query


class Stats:
    """What the process has run: how the stubs' calls batched, and how long it waited for the device's results."""

    def __init__(self) -> None:
        self.batches = self.query_batches = self.calls = self.sequences = self.tokens = 0
        self.waited_s = 0.0  # in a launched batch's reader: the device's time the host did not overlap
        self.started = time.monotonic()

    def count(self, batch: list[Call]) -> None:
        self.batches += 1
        self.query_batches += batch[0].query
        self.calls += len(batch)
        self.sequences += sum(len(call.lengths) for call in batch)
        self.tokens += sum(len(call.ids) for call in batch)

    def answer(self) -> bytes:
        figures = {name: value for name, value in vars(self).items() if name != "started"}
        body = json.dumps({**figures, "up_s": time.monotonic() - self.started, "pid": os.getpid()}).encode()
        return ANSWER.pack(STATUS_STATS, 0, 0, len(body)) + body


def read_call(conn: socket.socket, stats: Stats) -> Call | None:
    """The connection's next call; None for a stats request, answered here."""
    sequences, tokens, flags, _ = CALL.unpack(recv_exact(conn, CALL.size))
    if flags & FLAG_STATS:
        conn.sendall(stats.answer())
        return None
    lengths = np.frombuffer(recv_exact(conn, 8 * sequences), np.int64)
    ids = np.frombuffer(recv_exact(conn, 4 * tokens), np.int32)
    types = np.frombuffer(recv_exact(conn, 4 * tokens), np.int32) if flags & FLAG_TYPES else None
    return Call(conn, lengths, ids, types, bool(flags & FLAG_QUERY))


def rows_answer(rows: np.ndarray) -> bytes:
    return ANSWER.pack(0, rows.shape[0], rows.shape[1], rows.nbytes) + rows.tobytes()


def error_answer(message: str) -> bytes:
    body = message.encode()
    return ANSWER.pack(1, 0, 0, len(body)) + body


class Connections:
    """The stubs' connections: calls read as they come, answers sent without waiting for a stub that is not reading
    yet (a stub reads a batch's rows only after it has sent its next one, and a socket's buffer holds less than a
    large batch's rows): what does not fit now waits in the connection's outbox until it can be written."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.outboxes: dict[socket.socket, deque[memoryview]] = {}

    def poll(self, timeout: float, scheduler: Scheduler) -> None:
        for key, events in self.selector.select(timeout):
            conn = key.fileobj
            if conn is self.listener:
                conn, _ = self.listener.accept()
                self.selector.register(conn, selectors.EVENT_READ)
                self.outboxes[conn] = deque()
                continue
            try:
                if events & selectors.EVENT_WRITE:
                    self._flush(conn)
                if events & selectors.EVENT_READ and (call := read_call(conn, scheduler.stats)) is not None:
                    scheduler.add(call)
            except OSError:  # ConnectionError too: the stub is gone
                self.close(conn, scheduler)

    def send(self, conn: socket.socket, data: bytes) -> None:
        outbox = self.outboxes.get(conn)
        if outbox is None:  # closed meanwhile
            return
        outbox.append(memoryview(data))
        try:
            self._flush(conn)
        except OSError:
            self.close(conn, None)

    def _flush(self, conn: socket.socket) -> None:
        outbox = self.outboxes[conn]
        while outbox:
            try:
                sent = conn.send(outbox[0], socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if sent < len(outbox[0]):
                outbox[0] = outbox[0][sent:]
            else:
                outbox.popleft()
        self.selector.modify(conn, selectors.EVENT_READ | (selectors.EVENT_WRITE if outbox else 0))

    def close(self, conn: socket.socket, scheduler: Scheduler | None) -> None:
        if self.outboxes.pop(conn, None) is None:
            return
        self.selector.unregister(conn)
        if scheduler is not None:
            scheduler.drop(conn)
        conn.close()


class Scheduler:
    """The waiting calls, and which of them run as the next batch."""

    def __init__(self, max_tokens: int, texts_beside_queries: int = 0) -> None:
        self.max_tokens, self.texts_beside_queries = max_tokens, texts_beside_queries
        self.stats = Stats()
        self.queries: deque[Call] = deque()
        self.others: deque[Call] = deque()
        self.last_query = -QUERIES_COME_S

    def add(self, call: Call) -> None:
        if call.query:
            self.last_query = time.monotonic()
        (self.queries if call.query else self.others).append(call)

    def __bool__(self) -> bool:
        return bool(self.queries or self.others)

    def drop(self, conn: socket.socket) -> None:
        """A closed connection's calls: nobody reads their rows."""
        for waiting in (self.queries, self.others):
            kept = [call for call in waiting if call.conn is not conn]
            waiting.clear()
            waiting.extend(kept)

    def next_batch(self) -> list[Call]:
        waiting = self.queries or self.others
        texts = None  # the most sequences, beside queries
        if waiting is self.others and time.monotonic() - self.last_query < QUERIES_COME_S:
            texts = self.texts_beside_queries or None
        batch = [waiting.popleft()]
        tokens, sequences = len(batch[0].ids), len(batch[0].lengths)
        while waiting and tokens + len(waiting[0].ids) <= self.max_tokens:
            if texts is not None and sequences + len(waiting[0].lengths) > texts:
                break
            tokens, sequences = tokens + len(waiting[0].ids), sequences + len(waiting[0].lengths)
            batch.append(waiting.popleft())
        self.stats.count(batch)
        return batch


def launch(engine, batch: list[Call]):
    """The batch begun on the engine: a callable giving its rows, or the error that stopped it."""
    ids = np.concatenate([call.ids for call in batch])
    lengths = np.concatenate([call.lengths for call in batch])
    types = None
    if any(call.types is not None for call in batch):
        types = np.concatenate([call.types if call.types is not None else np.zeros_like(call.ids) for call in batch])
    try:
        return engine.submit(ids, lengths, types)
    except Exception as error:  # every call of the batch is told, and the process serves on
        return error


def answer(batch: list[Call], begun, connections: Connections, stats: Stats) -> None:
    """Each call of a finished batch its own rows (or the error), in the batch's order."""
    try:
        if isinstance(begun, Exception):
            raise begun
        started = time.perf_counter()
        outputs = begun()
        stats.waited_s += time.perf_counter() - started
        if not isinstance(outputs, np.ndarray) or outputs.ndim != 2:
            raise TypeError(f"the engine process serves one row per sequence; this engine gave {type(outputs)}")
        rows = np.ascontiguousarray(outputs, dtype=np.float32)
    except Exception as error:
        for call in batch:
            connections.send(call.conn, error_answer(f"{type(error).__name__}: {error}"))
        return
    start = 0
    for call in batch:
        end = start + len(call.lengths)
        connections.send(call.conn, rows_answer(rows[start:end]))
        start = end


def serve(engine, listener: socket.socket, scheduler: Scheduler, parent_pid: int) -> None:
    connections = Connections(listener)
    in_flight = None  # (batch, its rows' reader)
    last_check = time.monotonic()
    while True:
        connections.poll(1.0 if in_flight is None and not scheduler else 0, scheduler)
        launched = None
        if scheduler:
            batch = scheduler.next_batch()
            launched = (batch, launch(engine, batch))
        if in_flight is not None:
            answer(*in_flight, connections, scheduler.stats)
        in_flight = launched
        if in_flight is not None and not engine.launches_ahead:  # computed in launch(): its rows go now, not after
            answer(*in_flight, connections, scheduler.stats)  # the next batch's
            in_flight = None
        if time.monotonic() - last_check > 1.0:
            last_check = time.monotonic()
            if parent_pid and not running(parent_pid):
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", required=True, help="the engine's kind (engines.ENGINES)")
    parser.add_argument("--model-dir", type=Path, required=True, help="the model's version folder")
    parser.add_argument("--device", required=True)
    parser.add_argument("--options", default="{}", help="the engine's options, JSON")
    parser.add_argument("--stem", type=Path, required=True, help="its files: STEM.sock, .ready, .lock, .log")
    parser.add_argument("--max-tokens", type=int, default=16384, help="most tokens a batch of calls takes")
    parser.add_argument("--parent-pid", type=int, default=0, help="end when this process has (0: never)")
    parser.add_argument("--texts-beside-queries", type=int, default=0, help="most sequences of an ingestion batch "
                        "while queries come (0: no bound but --max-tokens)")  # fmt: skip
    args = parser.parse_args(argv)
    from . import load_engine

    remove_stale(args.stem.parent)
    # It serves the query lane too: not at the nice value of the model's stub that happened to start it
    # (priority.ingestion_nice), where the system lets it go back to 0.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    # A SIGTERM (a container's stop, say) leaves no files either; the launcher's reap SIGKILLs tritonserver's group
    # and removes the files itself.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    engine = load_engine(args.kind, args.model_dir, args.device, json.loads(args.options))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = args.stem.with_suffix(".sock")
    path.unlink(missing_ok=True)
    listener.bind(str(path))
    listener.listen(256)
    args.stem.with_suffix(".ready").write_text(f"{os.getpid()}\n")  # loaded and listening; its pid, for a stub
    # that finds it hung (engines/shared.py)
    print(f"engine process {os.getpid()}: {args.kind} on {args.device}, {path}", file=sys.stderr, flush=True)
    try:
        serve(engine, listener, Scheduler(args.max_tokens, args.texts_beside_queries), args.parent_pid)
    finally:  # its tritonserver has ended: nothing of it is wanted
        for suffix in SUFFIXES:
            args.stem.with_suffix(suffix).unlink(missing_ok=True)
    return 0


def remove_stale(folder: Path) -> None:
    """The files of engine processes whose tritonserver is gone (a process killed outright leaves them)."""
    for path in folder.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and not running(int(pid)) and path.suffix in SUFFIXES:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
