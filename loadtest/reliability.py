"""python -m loadtest.reliability: faults under load, every request counted.

Starts the real launcher (`python -m serving.launcher`: tritonserver, stub watchdog, /ready, drain on
SIGTERM) on free ports and keeps a closed-loop load on it through client.TextClient (retries with backoff and
jitter within a deadline), with a share of bad requests (a text over tokenizer.max_text_bytes), through phases:

  steady              nothing happens
  restart             SIGTERM the launcher (Triton drains), then start a new one on the same ports
  crash-tritonserver  SIGKILL tritonserver (as its 2.51 segfaults end it); the launcher starts it again
  hang-tritonserver   SIGSTOP tritonserver (alive, answering nothing); the launcher's canary finds it, /live
                      turns 503, and the launcher kills it and starts it again (loadtest/faults.py holds each fault)
  oversized-bodies    HTTP bodies over front.max_body_bytes, each content type, to an existing and an unknown
                      model, and a form-typed 5 MB body (the one that crashes tritonserver 2.51 directly)
  kill-MODEL          SIGKILL one stub process of each Python model in turn (one_stage: ensemble; two_stage:
                      tokenizer, encoder; with several models, every model's); the watchdog reloads it
  kill-engine-process, hang-engine-process (with engine.options.shared_process): SIGKILL the stubs' engine
                      process (their next calls start another) or SIGSTOP it (the canary has the stubs reloaded,
                      and the first to connect replaces it)

With several settings files (one per model) each model gets its own load of `users` (embed, classify, or a
reranker's query with one text) and is counted apart: a phase reports every model's figures and their sum.
Each embedding model also gets `api_users` through the API front (POST /v1/embeddings, base64, where
concurrent requests share coalesced Triton calls), counted apart as "MODEL (api)"; they retry as the OpenAI
SDKs do (a refused connection, 429 and the gateway statuses 502-504, with backoff) within the same deadline.

A phase is phase_s / 2 of load, the event (as long as it takes: its recovery time is in the table), and
phase_s / 2 more; its "seconds" says how long it ran in all.

For each phase: requests sent, succeeded, good requests refused by kind (none may be), what the bad requests
got (each must be refused as invalid_argument), lost (sent without any answer once the load
stopped: must be 0) and the longest time without a successful response; for the faults, how long until
the launcher's /ready said 200 again. Writes reliability.json into --out and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from client.core import ClientError, RetryPolicy, TextClient
from common.engine_choice import shares_engine_process
from loadtest.corpus import load_text
from loadtest.faults import (
    crash_tritonserver,
    engine_process_fault,
    hang_tritonserver,
    kill_stub,
    oversized_bodies,
    restart,
)
from model_repository.configs import python_models
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_deployment


def error_kind(exc: BaseException) -> str:
    """A short name for why a request was refused, from the gRPC status in the client's message."""
    text = str(exc)
    for status, kind in (
        ("INVALID_ARGUMENT", "invalid_argument"),
        ("UNAVAILABLE", "unavailable"),
        ("DEADLINE_EXCEEDED", "deadline"),
        ("CANCELLED", "cancelled"),
        ("is not healthy", "dead_stub"),
        ("NOT_FOUND", "model_not_found"),
        ("INTERNAL", "internal"),
    ):
        if status in text:
            return kind
    return "other"


# The API front's answers, as the reliability tally names them; the statuses an OpenAI SDK tries again.
API_KINDS = {400: "invalid_argument", 404: "model_not_found", 413: "too_large", 429: "overloaded", 500: "internal"}
API_KINDS |= {502: "unavailable", 503: "unavailable", 504: "deadline"}
API_RETRYABLE = {429, 502, 503, 504}
QUERY = "How does the server stay up under faults?"  # what a reranker's load scores each text against
PHASES = [
    "steady",
    "restart",
    "crash-tritonserver",
    "hang-tritonserver",
    "oversized-bodies",
]  # then, with engine.options.shared_process, these; then kill-<model> per Python model
ENGINE_PROCESS_FAULTS = {"kill-engine-process": signal.SIGKILL, "hang-engine-process": signal.SIGSTOP}


class ApiUser:
    """One closed-loop user of the API front's POST /v1/embeddings at `url`, for model `model`."""

    def __init__(self, url: str, model: str, timeout_s: float) -> None:
        self.url, self.model, self.timeout_s = url, model, timeout_s

    def embed(self, text: str) -> tuple[str, str]:
        """(kind, detail): "ok", or how the request was refused once retrying would not help or the deadline passed."""
        body = json.dumps({"input": [text], "model": self.model, "encoding_format": "base64"}).encode()
        deadline, delays = time.monotonic() + self.timeout_s, RetryPolicy().delays()
        while True:
            request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=max(0.1, deadline - time.monotonic())) as response:
                    rows = json.loads(response.read())["data"]
                return ("ok", "") if len(rows) == 1 else ("bad_answer", f"{len(rows)} rows for one text")
            except urllib.error.HTTPError as exc:
                kind, detail = API_KINDS.get(exc.code, f"http_{exc.code}"), exc.read()[:300].decode(errors="replace")
                if exc.code not in API_RETRYABLE:
                    return kind, detail
            except OSError as exc:  # refused or reset while the front restarts, or no answer in time
                kind, detail = "unavailable", str(exc)[:300]
            delay = next(delays)
            if time.monotonic() + delay >= deadline:
                return kind, detail
            time.sleep(delay)


@dataclass
class Load:
    """`users` threads, each a TextClient (route "grpc") or an ApiUser (route "api", `url` the front's
    /v1/embeddings) in a closed loop; every `bad_every`-th request carries a text over tokenizer.max_text_bytes
    (refused as invalid before it is decoded: INVALID_ARGUMENT, or the front's 400). Each outcome is recorded
    with whether its request was a bad one: a good request refused is counted apart from them."""

    url: str
    users: int
    max_text_bytes: int
    model: str = "ensemble"  # the served model this load calls
    task: str = "embedding"  # what it asks of it: embed, classify, or a reranker's score for (QUERY, text)
    timeout_s: float = 30.0
    route: str = "grpc"  # or "api"
    bad_every: int = 50
    phase: str = "steady"
    records: list = field(default_factory=list)  # (phase, bad, kind, finished_at)
    sent: Counter = field(default_factory=Counter)
    bad_sent: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)  # kind -> the first message seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list = field(default_factory=list)

    def start(self) -> Load:
        texts = load_text()
        self._too_long = "a " * (self.max_text_bytes // 2 + 1)
        for user in range(self.users):
            thread = threading.Thread(target=self._user, args=(user, texts), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _user(self, user: int, texts: list[str]) -> None:
        if self.route == "api":
            send = ApiUser(self.url, self.model, self.timeout_s).embed
        else:
            client = TextClient(self.url, "grpc", self.model, timeout_s=self.timeout_s, retry=RetryPolicy())
            send = functools.partial(self._grpc_call, client)
        count = 0
        while not self._stop.is_set():
            count += 1
            bad = count % self.bad_every == 0
            text = self._too_long if bad else texts[(user * 7919 + count) % len(texts)]
            phase = self.phase
            with self._lock:
                self.sent[phase] += 1
                self.bad_sent[phase] += bad
            kind, detail = send(text)
            if kind != "ok":
                self.examples.setdefault(kind, detail)
            with self._lock:
                self.records.append((phase, bad, kind, time.monotonic()))
        if self.route != "api":
            client.close()

    def _grpc_call(self, client: TextClient, text: str) -> tuple[str, str]:
        try:
            client.infer([text], QUERY if self.task == "rerank" else None)
        except ClientError as exc:
            return error_kind(exc), str(exc)[:300]
        return "ok", ""

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 10)

    def tally(self, phase: str, start: float, end: float) -> dict:
        with self._lock:
            records = [r for r in self.records if r[0] == phase]
            sent, bad_sent = self.sent[phase], self.bad_sent[phase]
        kinds = Counter(kind for _, bad, kind, _ in records if not bad)
        bad = Counter(kind for _, bad, kind, _ in records if bad)
        successes = sorted([start, *(t for _, _, kind, t in records if kind == "ok" and t <= end), end])
        gap = max(b - a for a, b in itertools.pairwise(successes)) if len(successes) > 1 else None
        return {
            "sent": sent,
            "succeeded": kinds.pop("ok", 0),
            "refused": dict(sorted(kinds.items())),  # good requests only: must stay empty
            "bad": {"sent": bad_sent, **dict(sorted(bad.items()))},  # each one must be refused: invalid_argument
            "lost": sent - len(records),
            "longest_gap_without_success_s": round(gap, 3) if gap is not None else None,
        }


def summed(tallies) -> dict:
    """Several models' tallies of one phase as one: counts added, refusals merged, the longest gap."""
    tallies = list(tallies)
    total = {key: sum(t[key] for t in tallies) for key in ("sent", "succeeded", "lost")}
    for key in ("refused", "bad"):
        merged: Counter = Counter()
        for tally in tallies:
            merged.update(tally[key])  # unlike Counter's +, keeps a count of 0 ("sent": 0 bad requests)
        total[key] = dict(sorted(merged.items()))
    gaps = [t["longest_gap_without_success_s"] for t in tallies if t["longest_gap_without_success_s"] is not None]
    total["longest_gap_without_success_s"] = max(gaps) if gaps else None
    return total


def run(
    settings_paths: list[Path], repository: Path, out: Path, users: int, phase_s: float, api_users: int = 4
) -> dict:
    deployment = load_deployment(settings_paths)
    settings = deployment.first
    out.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    launcher = Launcher(list(settings_paths), repository, ports, out / "launcher.log").start()
    url = f"127.0.0.1:{ports.grpc}"
    loads = {
        served: Load(url, users, model.tokenizer.max_text_bytes, served, model.model.task).start()
        for served, model in deployment.served().items()
    }
    if ports.api and api_users:
        api_url = f"http://127.0.0.1:{ports.api}/v1/embeddings"
        for served, model in deployment.served().items():
            if model.model.task == "embedding":
                limit = model.tokenizer.max_text_bytes
                load = Load(api_url, api_users, limit, model.model.name, route="api")
                loads[f"{served} (api)"] = load.start()
    stages = [name for model in deployment.models for name in python_models(model, deployment.names(model))]
    shared = any(shares_engine_process(model.engine.options) for model in deployment.models)
    engine_phases = list(ENGINE_PROCESS_FAULTS) if shared else []
    phases, started = {}, time.monotonic()
    try:
        for phase in PHASES + engine_phases + [f"kill-{model}" for model in stages]:
            start = time.monotonic()
            for load in loads.values():
                load.phase = phase
            event: dict = {}
            time.sleep(phase_s / 2)
            if phase in engine_phases:
                event = engine_process_fault(launcher, ENGINE_PROCESS_FAULTS[phase])
            elif phase.startswith("kill-"):
                event = kill_stub(launcher, phase.removeprefix("kill-"))
            elif phase == "restart":
                launcher, event = restart(launcher)
            elif phase == "crash-tritonserver":
                event = crash_tritonserver(launcher)
            elif phase == "hang-tritonserver":
                event = hang_tritonserver(launcher)
            elif phase == "oversized-bodies":
                event = oversized_bodies(launcher, settings.front.max_body_bytes)
            time.sleep(phase_s / 2)
            phases[phase] = {"event": event, "start": start, "end": time.monotonic()}
    finally:
        for load in loads.values():
            load.stop()
        stopping = time.monotonic()
        launcher.terminate()
        try:  # after the last phase (a stub kill): does the drain still end clean with a replaced stub?
            code = launcher.process.wait(timeout=settings.server.exit_timeout_s + deployment.triton_exit_timeout_s + 20)
        except subprocess.TimeoutExpired:
            launcher.kill()
            code = None
        final_stop = {"launcher_exit_code": code, "drain_s": round(time.monotonic() - stopping, 3)}
    for name, phase in phases.items():
        start, end = phase.pop("start"), phase.pop("end")
        per_model = {served: load.tally(name, start, end) for served, load in loads.items()}
        phase.update(seconds=round(end - start, 2), **summed(per_model.values()), models=per_model)
    total = summed(phases.values())
    return {
        "benchmark": "reliability",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu_cores": os.cpu_count(), "platform": platform.platform()},
        "command": "python -m loadtest.reliability " + " ".join(sys.argv[1:]),
        "settings": [str(path) for path in settings_paths],
        "users": users,
        "api_users": api_users if any(load.route == "api" for load in loads.values()) else 0,
        "bad_request_share": f"1 in {Load.bad_every} (a text of max_text_bytes + 1 bytes)",
        "wall_s": round(time.monotonic() - started, 1),
        "phases": phases,
        "final_stop": final_stop,
        "total": total,
        "refusal_examples": {served: load.examples for served, load in loads.items()},
    }


def print_table(result: dict) -> None:
    header = f"{'phase':15s} {'sent':>7s} {'ok':>7s} {'good refused':20s} {'bad requests':34s}"
    print(f"{header} {'lost':>5s} {'gap s':>6s} recovery")
    for name, phase in result["phases"].items():
        refused = ", ".join(f"{k}: {v}" for k, v in phase["refused"].items()) or "-"
        bad = ", ".join(f"{k}: {v}" for k, v in phase["bad"].items()) or "-"
        event = phase["event"]
        recovery = ""
        if "watchdog_reload_s" in event:
            recovery = f"/ready 200 again after {event['ready_again_s']:.2f} s (reload {event['watchdog_reload_s']} s)"
        elif "live_503_after_s" in event:
            recovery = (
                f"/live 503 after {event['live_503_after_s']:.2f} s, /ready 200 after {event['ready_again_s']:.2f} s"
            )
        elif "tritonserver_restarts" in event:
            recovery = f"tritonserver started again, /ready 200 after {event['ready_again_s']:.2f} s"
        elif "bodies" in event:
            survived = "tritonserver survived" if event["tritonserver_survived"] else "TRITONSERVER DIED"
            recovery = f"{event['bodies']} bodies answered {event['answers']}; {survived}"
        elif "engine_pids" in event:
            recovery = f"{event['signal']}: a new engine process, /ready 200 after {event['ready_again_s']:.2f} s"
        elif "drain_s" in event:
            recovery = f"drained in {event['drain_s']:.2f} s, new server ready after {event['ready_again_s']:.2f} s"
        gap = phase["longest_gap_without_success_s"]
        print(
            f"{name:15s} {phase['sent']:7d} {phase['succeeded']:7d} {refused:20s} {bad:34s} {phase['lost']:5d} "
            f"{gap if gap is not None else '-':>6} {recovery}"
        )
        if len(phase["models"]) > 1:  # several models: each one's own counts below the sum
            for model, own in phase["models"].items():
                counts = f"{own['sent']} sent, {own['succeeded']} ok, {own['lost']} lost"
                print(f"  {model}: {counts}, good refused {own['refused'] or 'none'}")
    total = result["total"]
    print(
        f"total: {total['sent']} sent, {total['succeeded']} succeeded, good refused {total['refused']}, "
        f"bad answered {total['bad']}, {total['lost']} lost"
    )
    stop = result["final_stop"]
    print(f"final SIGTERM after the last phase: exit {stop['launcher_exit_code']} in {stop['drain_s']:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.reliability", description=__doc__)
    parser.add_argument(
        "--settings", type=Path, nargs="+", default=[Path("settings/defaults.toml")], help="one file per model"
    )
    parser.add_argument("--repository", type=Path, help="generated model repository (default: from the settings)")
    parser.add_argument("--users", type=int, default=8, help="gRPC users per model")
    parser.add_argument("--api-users", type=int, default=4, help="API-front users per embedding model (0: none)")
    parser.add_argument("--phase-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("build/reliability"))
    args = parser.parse_args(argv)
    repository = args.repository or load_deployment(args.settings).repository_dir
    result = run(args.settings, repository, args.out, args.users, args.phase_seconds, args.api_users)
    (args.out / "reliability.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    return 0 if held(result["total"]) and result["final_stop"]["launcher_exit_code"] == 0 else 1


def held(total: dict) -> bool:
    """Nothing lost, no good request refused, and every bad one refused as INVALID_ARGUMENT."""
    answers = dict(total["bad"])
    sent = answers.pop("sent", 0)
    return total["lost"] == 0 and not total["refused"] and answers == ({"invalid_argument": sent} if sent else {})


if __name__ == "__main__":
    raise SystemExit(main())
