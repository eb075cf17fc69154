"""Restart a Python stage whose stub process died, and say so on readiness.

Triton 2.51 neither restarts a dead Python-backend stub nor reports one: /v2/health/ready and the model's
own readiness stay 200 while every request routed to that instance fails with "Stub process '...' is not
healthy". The stubs are child processes of tritonserver, one per model instance. The watchdog counts the
live ones per model; when a model has fewer than it started with, it reloads that model through the
repository API (explicit model-control mode) with one config parameter changed, because Triton treats a
load with an unchanged config as a no-op, while a changed one loads fresh instances and swaps them in.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.launcher.procfs import Stub, running, stubs
from serving.launcher.shm import remove_regions

# A config parameter the stages ignore; bumping it is what makes Triton reload the model.
GENERATION_PARAMETER = "watchdog_generation"
# The header the launcher's Triton requires on the repository API (--http-restricted-api), so that only the
# watchdog, which knows the per-launch value, can load and unload models.
ADMIN_HEADER = "bert-triton-admin-key"


@dataclass
class Restart:
    model: str
    detected_at: float  # time.time()
    live: int
    expected: int
    replaced: frozenset[Stub] = frozenset()  # the model's stubs alive when the death was seen (the old version's)
    recovered_at: float | None = None
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        return round(self.recovered_at - self.detected_at, 3) if self.recovered_at else None


@dataclass
class StubWatchdog:
    """Polls every `interval_s`; `problems()` is what the launcher's /ready reports while a stage is down."""

    server_pid: int
    http_url: str  # host:port of Triton's HTTP endpoint
    admin_key: str
    interval_s: float = 0.5
    log: Callable[[str], None] = field(default=functools.partial(print, flush=True))
    restarts: list[Restart] = field(default_factory=list)
    expected: Counter = field(default_factory=Counter)
    regions: set = field(default_factory=set)  # every stub's shared-memory region seen, to remove when Triton exits
    _seen: set = field(default_factory=set)  # the stubs the last poll found
    _down: dict = field(default_factory=dict)  # model -> Restart in progress
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StubWatchdog:
        """Call once every model is loaded: the stubs alive now are the count each model must keep."""
        self.expected = Counter(stub.model for stub in self._live())
        self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)

    def problems(self) -> list[str]:
        with self._lock:
            return [
                f"{r.model}: {r.live} of {r.expected} stub processes alive, restarting"
                + (f" (last attempt: {r.error})" if r.error else "")
                for r in self._down.values()
            ]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception as exc:  # a dead watchdog thread would leave every later stub death unmended
                self.log(f"watchdog: a check failed ({exc!r}); polling on")

    def replaced_stubs(self) -> set[Stub]:
        """Stubs of model versions the watchdog replaced that were still alive then. Tritonserver 2.51 never
        unloads a version once requests reached its dead stub (their response factories, which that stub alone
        would have released, hold it), so these live on, serving nothing, until tritonserver exits."""
        return {stub for restart in self.restarts for stub in restart.replaced}

    def _live(self) -> list[Stub]:
        found = stubs(self.server_pid)
        self.regions.update(stub.region for stub in found)
        # A dead stub's 16 MiB region serves nobody (a reload makes new ones): freed now, not at tritonserver's
        # exit, so that stubs that keep dying cannot fill /dev/shm (a container's is 64 MiB by default).
        dead = {stub for stub in self._seen.difference(found) if not running(stub.pid)}
        remove_regions({stub.region for stub in dead})
        self._seen = set(found)
        return found

    def check(self) -> None:
        found = self._live()
        live = Counter(stub.model for stub in found)
        for model, expected in self.expected.items():
            if live[model] >= expected and model not in self._down:
                continue
            with self._lock:
                restart = self._down.get(model)
                if restart is None:
                    survivors = frozenset(stub for stub in found if stub.model == model)
                    restart = self._down[model] = Restart(model, time.time(), live[model], expected, survivors)
                    self.log(f"watchdog: {model} has {live[model]} of {expected} stubs alive; reloading it")
            if self._stop.is_set():
                return
            try:
                self.reload(model)
            except (OSError, ValueError) as exc:  # urllib errors are OSErrors; the next poll retries
                restart.error = str(exc)[:300]
                self.log(f"watchdog: reloading {model} failed: {restart.error}")
                continue
            if sum(stub.model == model for stub in self._live()) >= expected:
                restart.recovered_at = time.time()
                with self._lock:
                    del self._down[model]
                    self.restarts.append(restart)
                self.log(f"watchdog: {model} reloaded in {restart.seconds:.2f} s")

    def reload(self, model: str) -> None:
        config = self._request("GET", f"/v2/models/{model}/config")
        parameters = config.setdefault("parameters", {})
        generation = int(parameters.get(GENERATION_PARAMETER, {}).get("string_value", "0")) + 1
        parameters[GENERATION_PARAMETER] = {"string_value": str(generation)}
        self._request("POST", f"/v2/repository/models/{model}/load", {"parameters": {"config": json.dumps(config)}})

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"http://{self.http_url}{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={ADMIN_HEADER: self.admin_key, "Content-Type": "application/json"},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise ValueError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from None
        return json.loads(text) if text else {}
