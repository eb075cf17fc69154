"""FrontWorkers: a front (serving/http_front, serving/api) as worker processes on one port, each started again
when it dies; the launcher runs both fronts so, and the API front runs itself so as a container of its own."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time

from serving.processes import die_with_parent

log = logging.getLogger("launcher")
STOP_WAIT_S = 5  # how long a worker has to finish what it holds after SIGTERM, before SIGKILL


class FrontWorkers:
    """`workers` processes of one Python command (their arguments after the interpreter) that share host:port
    with SO_REUSEPORT, started again when one dies (a thread checks). `name` is how messages call them."""

    def __init__(self, name: str, arguments: list[str], workers: int, host: str, port: int) -> None:
        self.name, self.command = name, [sys.executable, *arguments]
        self.host, self.port, self.workers = host, port, workers
        self.processes: list[subprocess.Popen] = []
        self.restarts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _spawn(self) -> subprocess.Popen:
        # A session of its own: a terminal's Ctrl-C reaches the launcher, which stops the front after Triton.
        return subprocess.Popen(self.command, preexec_fn=die_with_parent, start_new_session=True)

    def start(self, timeout_s: float = 20.0) -> FrontWorkers:
        with self._lock:
            self.processes = [self._spawn() for _ in range(self.workers)]
        deadline = time.monotonic() + timeout_s
        while not self._accepts():
            dead = [p.returncode for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} on {self.host}:{self.port} did not start (exit codes {dead})")
            time.sleep(0.05)
        threading.Thread(target=self._supervise, name="front", daemon=True).start()
        return self

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host if self.host != "0.0.0.0" else "127.0.0.1", self.port), 1):
                return True
        except OSError:
            return False

    def _supervise(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for index, process in enumerate(self.processes):
                    if process.poll() is not None and not self._stop.is_set():
                        log.warning(f"{self.name} worker exited with {process.returncode}; starting it again")
                        self.processes[index] = self._spawn()
                        self.restarts += 1

    def problems(self) -> list[str]:
        running = sum(process.poll() is None for process in self.processes)
        return [] if running else [f"the {self.name} is not running"]

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for process in self.processes:
                if process.poll() is None:
                    process.terminate()
            for process in self.processes:
                try:
                    process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
