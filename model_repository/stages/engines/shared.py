"""SharedEngine: a stub's engine that is one engine process shared by every stub of its model on its device.

With `engine.options = {shared_process = true}` a stage's stubs on one device call one process
(engine_process.py), which runs their calls together as larger batches, the query lane's first. The first stub to
come finds no process listening, starts it (under a lock, so only one does) and waits until it has loaded; the
others connect. A process that does not answer a stub that connects is hung: that stub ends it and starts another
(the launcher's canary has a hung model's stubs killed and reloaded). The process is named by tritonserver's pid and
the model's files, device, engine kind and options, and ends with that tritonserver.

Rows only (dense embeddings and classification logits): a sparse, hybrid or multi-vector model's outputs are not
rows and are refused when the stage loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.contract import ENGINE_PROCESS_PREFIX, ServingSpec

from .base import Engine
from .engine_process import ANSWER, CALL, FLAG_QUERY, FLAG_STATS, FLAG_TYPES, STATUS_STATS, recv_exact

ROW_TASKS = ("embedding", "classification", "rerank")
# Reconnections one call may make: a process killed while a stub reconnects can accept the new connection on its
# listener and then drop it (test_shared_engine's restart test saw a reset after the first reconnection in 4 of 13
# runs).
RECONNECTS = 3
# A process that does not answer a new connection's stats request within this is hung (stopped, or stuck in its
# device): it answers between batches, and one batch (engine_process's 16,384 tokens at most) takes far less. The
# launcher's canary then has the model's stubs killed, and the first reloaded one to connect replaces the process.
ANSWERS_WITHIN_S = 10.0


def process_name(parent_pid: int, model_dir: Path, device: str, kind: str, options: dict) -> str:
    """One process per tritonserver, exported model, device, engine kind and options. The model is its version
    folder's files by inode, so that the query lane's folder, whose files are hard links to the model's, names the
    same process."""
    files = []
    for path in sorted(Path(model_dir).iterdir()):
        if path.is_file() and path.name != "model.py":
            stat = path.stat()
            files.append((path.name, stat.st_dev, stat.st_ino, stat.st_size))
    key = json.dumps([files, device, kind, options], sort_keys=True)
    return f"{ENGINE_PROCESS_PREFIX}{parent_pid}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def asked_stats(sock: socket.socket) -> dict:
    """The counters (engine_process.Stats) of the engine process on a connection with no call in flight; OSError
    (TimeoutError too) when it does not answer within ANSWERS_WITHIN_S."""
    sock.settimeout(ANSWERS_WITHIN_S)
    try:
        sock.sendall(CALL.pack(0, 0, FLAG_STATS, 0))
        status, _, _, size = ANSWER.unpack(recv_exact(sock, ANSWER.size))
        body = recv_exact(sock, size)
    finally:
        sock.settimeout(None)
    if status != STATUS_STATS:
        raise RuntimeError(f"the engine process answered status {status} to a stats request")
    return json.loads(body)


def answering_connection(socket_path: Path) -> tuple[socket.socket, dict]:
    """A connection to the engine process listening at socket_path, and its counters: asked at once, since a stopped
    process's listener still accepts connections. OSError or RuntimeError when it does not answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ANSWERS_WITHIN_S)  # a full backlog blocks connect()
    try:
        sock.connect(str(socket_path))
        return sock, asked_stats(sock)
    except (OSError, RuntimeError):
        sock.close()
        raise


def process_stats(socket_path: Path) -> dict:
    """The counters of the engine process listening at socket_path, over a connection of their own."""
    sock, stats = answering_connection(socket_path)
    sock.close()
    return stats


class SharedEngine(Engine):
    """Calls the device's engine process; submit() sends a call and returns its answer's reader. A process that
    died is started again, and the calls it had not answered are sent to the new one (an engine call changes
    nothing, so running it twice is safe)."""

    kind = "shared"
    queries_first = True  # the engine process runs the lane's waiting calls as a batch of their own

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        super().__init__(model_dir, spec, device, options)
        if spec.task not in ROW_TASKS:
            raise ValueError(f"engine option shared_process serves row outputs ({', '.join(ROW_TASKS)}); this model's "
                             f"task is {spec.task}: remove shared_process from engine.options")  # fmt: skip
        self.inner_kind = options["inner_kind"]
        self.query = bool(options.get("query"))
        self.chunk_texts = int(options.get("chunk_texts") or 0)
        own = ("inner_kind", "query", "chunk_texts", "parent_pid")
        self.engine_options = {k: v for k, v in options.items() if k not in own}
        self.parent_pid = int(options.get("parent_pid") or os.getppid())  # a stub's: its tritonserver
        name = process_name(self.parent_pid, model_dir, device, self.inner_kind, self.engine_options)
        self.stem = Path(tempfile.gettempdir()) / name
        self.socket_path = self.stem.with_suffix(".sock")
        self.sock: socket.socket | None = None
        self.sent = 0  # calls numbered so far
        self.unanswered: deque[tuple[int, bytes]] = deque()  # sent calls not yet answered, in order
        self.answers: dict[int, np.ndarray | str] = {}  # read ahead of their collect()
        self._connect()

    def _connect(self) -> None:
        """Connect to the process, starting it first if none listens or it is hung: under a lock, so that one stub
        does while the others wait to connect to the new one."""
        ready, log_file = self.stem.with_suffix(".ready"), self.stem.with_suffix(".log")
        with open(self.stem.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.sock = self._try_connect()
            if self.sock is None:
                self._end_hung(ready)
                process = self._start(log_file)
                deadline = time.monotonic() + 600
                while not ready.exists():
                    if process.poll() is not None or time.monotonic() > deadline:
                        tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
                        raise RuntimeError(f"the engine process for {self.model_dir} did not start: {tail}")
                    time.sleep(0.05)
                self.sock = self._try_connect()
        if self.sock is None:
            raise RuntimeError(f"the engine process at {self.socket_path} does not answer (its log: {log_file})")

    def _try_connect(self) -> socket.socket | None:
        """A connection to a process that answers; None if none listens or the one listening is hung."""
        try:
            return answering_connection(self.socket_path)[0]
        except (OSError, RuntimeError):
            return None

    def _end_hung(self, ready: Path) -> None:
        """The files of a process that died, and a hung one itself (its pid is in STEM.ready), out of the way."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(ready.read_text())
            if str(self.stem).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a reused pid
                os.kill(pid, signal.SIGKILL)
        ready.unlink(missing_ok=True)

    def _start(self, log_file: Path) -> subprocess.Popen:
        package = __name__.rsplit(".", 1)[0]  # this engines package, however the stage was imported
        root = Path(__file__).resolve().parents[package.count(".") + 1]
        python = sys.executable  # a test's; a stub's is Triton's stub binary, its Python the first python3 on PATH
        if not Path(python).name.startswith("python"):
            python = shutil.which("python3") or "python3"
        command = [
            python, "-m", f"{package}.engine_process", "--kind", self.inner_kind, "--model-dir", str(self.model_dir),
            "--device", self.device, "--options", json.dumps(self.engine_options), "--stem", str(self.stem),
            "--parent-pid", str(self.parent_pid), "--texts-beside-queries", str(self.chunk_texts),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        with open(log_file, "wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)

    def _reconnect(self) -> None:
        """A new connection (a new process where the last one died), and every unanswered call sent to it."""
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._connect()
        for _, payload in self.unanswered:
            self.sock.sendall(payload)

    def submit(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
               wanted: frozenset[str] | None = None,
               kept: np.ndarray | None = None) -> Callable[[], object]:  # fmt: skip
        flags = (FLAG_QUERY if self.query else 0) | (FLAG_TYPES if types is not None else 0)
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        parts = [CALL.pack(len(lengths), len(ids), flags, 0), np.ascontiguousarray(lengths, np.int64).tobytes(),
                 ids.tobytes()]  # fmt: skip
        if types is not None:
            parts.append(np.ascontiguousarray(types, dtype=np.int32).tobytes())
        payload = b"".join(parts)
        number, self.sent = self.sent, self.sent + 1
        self.unanswered.append((number, payload))
        try:
            self.sock.sendall(payload)
        except OSError:  # the process is gone
            self._reconnect()
        self.computed_tokens = len(ids)
        return lambda: self._collect(number)

    def forward_packed(self, ids, lengths, types=None, wanted=None, kept=None):
        return self.submit(ids, lengths, types, wanted, kept)()

    def _collect(self, number: int) -> np.ndarray:
        reconnects = 0
        while number not in self.answers:  # answers come in the order of the calls
            try:
                status, rows, width, size = ANSWER.unpack(recv_exact(self.sock, ANSWER.size))
                body = recv_exact(self.sock, size)
            except OSError as error:  # ConnectionError too
                if reconnects == RECONNECTS:
                    raise RuntimeError(
                        f"the engine process ended {reconnects + 1} times during one call ({error})"
                    ) from error
                if reconnects:
                    time.sleep(0.05)  # a killed process's listener can outlive its connections for a moment
                reconnects += 1
                self._reconnect()
                continue
            answered, _ = self.unanswered.popleft()
            self.answers[answered] = (
                np.frombuffer(body, np.float32).reshape(rows, width) if status == 0 else body.decode(errors="replace")
            )
        found = self.answers.pop(number)
        if isinstance(found, str):
            raise RuntimeError(f"the engine process: {found}")
        return found
