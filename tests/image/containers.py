"""What tests/image/served_image.py runs the images with: the Docker CLI, the server container as the chart runs it,
its start watched, and a load whose every request is counted."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from client import RetryPolicy, TextClient
from settings import ROOT
from tests.support import DOCKER as DOCKER_DIR
from tests.support import VERSIONS, load_module

healthcheck = load_module("healthcheck", DOCKER_DIR / "healthcheck.py")

# Debian's client where there is one (make passes it): its BuildKit needs no buildx plugin.
DOCKER = os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")
SERVER_IMAGE = f"bert-triton-server:{VERSIONS['LOCAL_IMAGE_TAG']}"
LOCUST_IMAGE = f"bert-triton-locust:{VERSIONS['LOCAL_IMAGE_TAG']}"
NAME = "bert-triton-image-test"
HOST = "127.0.0.1"
# The default settings' ports: HTTP (the front), gRPC, metrics, the launcher's /ready, tritonserver's own HTTP, the API.
PORTS = (8000, 8001, 8002, 8003, 8010, 8080)
HTTP, GRPC, READY, API = f"http://{HOST}:8000", f"{HOST}:8001", f"http://{HOST}:8003/ready", f"http://{HOST}:8080"
BUNDLE = ROOT / "build" / "bundle"
OUT = ROOT / "build" / "image-test"


def docker(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    run = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and run.returncode:
        pytest.fail(f"{DOCKER} {' '.join(args)}: exit {run.returncode}: {(run.stderr or run.stdout).strip()[-3000:]}")
    return run


def inspect(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def wall(stamp: str) -> float:
    """Epoch seconds of one of Docker's RFC 3339 times."""
    return datetime.fromisoformat(stamp).timestamp()


def busy_ports() -> list[int]:
    busy = []
    for port in PORTS:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((HOST, port)) == 0:
                busy.append(port)
    return busy


def run_server(health_interval_s: float = 1.0) -> None:
    """The server image as the chart runs it: read-only root, its own non-root user, the bundle at /bundle and the
    settings at /etc/bert-triton/settings.toml (both read-only), /tmp a tmpfs and /dev/shm for the stubs' regions;
    on the host's network, listening on 127.0.0.1. Its health check is the image's, run every health_interval_s."""
    docker(
        "run", "--detach", "--name", NAME, "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "--shm-size", "256m", f"--health-interval={health_interval_s}s",
        "--volume", f"{BUNDLE}:/bundle:ro",
        "--volume", f"{BUNDLE / 'settings.toml'}:/etc/bert-triton/settings.toml:ro",
        SERVER_IMAGE,
        "--settings", "/etc/bert-triton/settings.toml", "--repository", "/bundle/repository", "--host", HOST,
    )  # fmt: skip


def v1_answers(timeout_s: float = 5.0) -> bool:
    """Whether POST /v1/embeddings answers 200 with one embedding now."""
    request = urllib.request.Request(
        f"{API}/v1/embeddings", json.dumps({"input": ["ready?"]}).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status == 200 and len(json.loads(response.read())["data"]) == 1
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


@dataclass
class Start:
    """The server's start as seen from outside: each sample (seconds after `docker run`, the healthcheck's reason
    or None, whether /v1 answered right after it), and each run of the image's HEALTHCHECK by Docker."""

    began: float
    samples: list[tuple[float, str | None, bool]] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)
    healthy_s: float | None = None


def watch_start(began: float, deadline_s: float = 300) -> Start:
    """Samples the healthcheck (docker/healthcheck.py, as the image runs it) and then /v1 until Docker says healthy."""
    start = Start(began)
    while time.time() - began < deadline_s:
        state = inspect(NAME)["State"]
        if not state["Running"]:
            pytest.fail(
                f"the server exited ({state['ExitCode']}) while starting:\n{docker('logs', NAME).stderr[-4000:]}"
            )
        for check in state["Health"]["Log"] or []:  # Docker keeps the last five
            start.checks[check["Start"]] = check
        reason = healthcheck.problem(HTTP, "ensemble", 2.0) or healthcheck.api_problem(API, 2.0)
        start.samples.append((round(time.time() - began, 2), reason, v1_answers()))
        if state["Health"]["Status"] == "healthy":
            start.healthy_s = round(time.time() - began, 2)
            return start
        time.sleep(0.2)
    pytest.fail(f"not healthy {deadline_s} s after docker run:\n{docker('logs', NAME).stderr[-4000:]}")


@dataclass
class Outcome:
    kind: str
    start: float
    end: float
    error: str | None


class Load:
    """Closed-loop users, half on KServe gRPC (the project's client, no retries) and half on /v1/embeddings, each
    request's outcome kept. A watcher reads the launcher's /ready every 50 ms; once it is not 200 the users send no
    more, as a load balancer would take the container out: what was sent before must all be answered."""

    def __init__(self, users: int = 8) -> None:
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.unready_at: float | None = None
        self.texts = (ROOT / "export" / "validation_sentences.txt").read_text().splitlines()
        kinds = ["grpc", "api"] * (users // 2)
        self.threads = [threading.Thread(target=getattr(self, kind), daemon=True) for kind in kinds]
        self.threads.append(threading.Thread(target=self.watch, daemon=True))

    def start(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        for thread in self.threads:
            thread.join(timeout_s)

    def _timed(self, kind: str, call) -> None:
        began = time.time()
        try:
            error = call()
        except Exception as exc:  # every failure counts, whatever raised it
            error = f"{type(exc).__name__}: {exc}"
        self.outcomes.append(Outcome(kind, began, time.time(), error))

    def grpc(self) -> None:
        with TextClient(GRPC, retry=RetryPolicy(attempts=1), timeout_s=30) as client:
            while not self.stop.is_set():
                text = random.choice(self.texts)
                self._timed("grpc", lambda t=text: None if client.embed([t]).shape == (1, 384) else "wrong shape")

    def api(self) -> None:
        def call(text: str) -> str | None:
            body = json.dumps({"model": "all-MiniLM-L6-v2", "input": [text]}).encode()
            request = urllib.request.Request(f"{API}/v1/embeddings", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return None if len(json.loads(response.read())["data"][0]["embedding"]) == 384 else "wrong length"

        while not self.stop.is_set():
            text = random.choice(self.texts)
            self._timed("api", lambda t=text: call(t))

    def watch(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(READY, timeout=1) as response:
                    ready = response.status == 200
            except (urllib.error.URLError, OSError):
                ready = False
            if not ready:
                self.unready_at = time.time()
                self.stop.set()
            time.sleep(0.05)
