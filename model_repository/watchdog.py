"""Restart a Python stage whose stub process died, and say so on readiness.

Triton 2.51 neither restarts a dead Python-backend stub nor reports one: /v2/health/ready and the model's
own readiness stay 200 while every request routed to that instance fails with "Stub process '...' is not
healthy". The stubs are child processes of tritonserver, one per model instance. The watchdog counts the
live ones per model; when a model has fewer than it started with, it reloads that model through the
repository API (explicit model-control mode) with one config parameter changed, because Triton treats a
load with an unchanged config as a no-op, while a changed one loads fresh instances and swaps them in.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# A config parameter the stages ignore; bumping it is what makes Triton reload the model.
GENERATION_PARAMETER = "watchdog_generation"
# The header the launcher's Triton requires on the repository API (--http-restricted-api), so that only the
# watchdog, which knows the per-launch value, can load and unload models.
ADMIN_HEADER = "bert-triton-admin-key"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def child_processes(parent: int, proc: Path = Path("/proc")) -> list[tuple[int, str, list[bytes]]]:
    """(pid, state, argv) of the processes whose parent is `parent`.

    From the parent's own children lists (/proc/PID/task/TID/children) where the kernel has them: a scan of
    all of /proc took minutes from a process whose 64 client threads contended for the GIL."""
    lists = list((proc / str(parent) / "task").glob("*/children"))
    if lists:
        pids = set()
        for path in lists:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                pids.update(int(pid) for pid in path.read_text().split())
        paths = [proc / str(pid) / "stat" for pid in sorted(pids)]
    else:
        paths = proc.glob("[0-9]*/stat")
    found = []
    for stat in paths:
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent:
                found.append((int(stat.parent.name), state, (stat.parent / "cmdline").read_bytes().split(b"\0")))
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile
    return found


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    region: str  # its shared-memory region's name in /dev/shm


def stubs(server_pid: int) -> list[Stub]:
    """Live (not zombie) Python-backend stub processes of tritonserver `server_pid`.

    A stub's command line is `triton_python_backend_stub <repository>/<model>/<version>/model.py <shm region>
    ...`; Triton does not reap a stub that died, so it lingers as a zombie ('Z') child."""
    return [
        Stub(pid, Path(argv[1].decode(errors="replace")).parts[-3], argv[2].decode(errors="replace"))
        for pid, state, argv in child_processes(server_pid)
        if state not in ("Z", "X") and len(argv) > 2 and argv[0].endswith(b"triton_python_backend_stub")
    ]


def stub_processes(server_pid: int) -> dict[str, list[int]]:
    """Live stub pids of tritonserver `server_pid`, per model."""
    found: dict[str, list[int]] = {}
    for stub in stubs(server_pid):
        found.setdefault(stub.model, []).append(stub.pid)
    return found


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """utime + stime of one process in seconds; 0 when it is gone."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # fields 14 and 15 of stat(5)


def stubs_cpu_s(server_pid: int) -> float:
    """CPU seconds the live stubs of tritonserver `server_pid` have used: it grows while any model executes."""
    return sum(process_cpu_s(pid) for pids in stub_processes(server_pid).values() for pid in pids)


SHM_REGION_PREFIX = "triton_python_backend_shm_region_"


def mapped_files(proc: Path = Path("/proc")) -> set[str]:
    """Every file some live process has mapped (the last field of /proc/PID/maps)."""
    mapped = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            mapped.update(line.split(None, 5)[5].strip() for line in maps.read_text().splitlines() if "/" in line)
        except (OSError, IndexError):
            continue  # the process ended meanwhile, or a line without a path
    return mapped


def remove_orphaned_shm(shm: Path = Path("/dev/shm"), min_age_s: float = 10.0) -> list[str]:
    """Delete the Python backend's shared-memory regions no live process maps (16 MiB each, left behind by
    every stub and tritonserver that was killed); a region younger than min_age_s may be one being set up."""
    mapped, removed, now = mapped_files(), [], time.time()
    for region in shm.glob(f"{SHM_REGION_PREFIX}*"):
        try:
            if str(region) not in mapped and now - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region.name)
        except OSError:
            continue  # removed by someone else meanwhile
    return removed


def remove_regions(names: set[str], shm: Path = Path("/dev/shm")) -> None:
    for name in names:
        if name.startswith(SHM_REGION_PREFIX):
            (shm / name).unlink(missing_ok=True)


@dataclass
class Restart:
    model: str
    detected_at: float  # time.time()
    live: int
    expected: int
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
    _down: dict = field(default_factory=dict)  # model -> Restart in progress
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StubWatchdog:
        """Call once every model is loaded: the stubs alive now are the count each model must keep."""
        self.expected = self._live()
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
            self.check()

    def _live(self) -> Counter:
        found = stubs(self.server_pid)
        self.regions.update(stub.region for stub in found)
        return Counter(stub.model for stub in found)

    def check(self) -> None:
        live = self._live()
        for model, expected in self.expected.items():
            if live[model] >= expected and model not in self._down:
                continue
            with self._lock:
                restart = self._down.get(model)
                if restart is None:
                    restart = self._down[model] = Restart(model, time.time(), live[model], expected)
                    self.log(f"watchdog: {model} has {live[model]} of {expected} stubs alive; reloading it")
            if self._stop.is_set():
                return
            try:
                self.reload(model)
            except (OSError, ValueError) as exc:  # urllib errors are OSErrors; the next poll retries
                restart.error = str(exc)[:300]
                self.log(f"watchdog: reloading {model} failed: {restart.error}")
                continue
            if self._live()[model] >= expected:
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
