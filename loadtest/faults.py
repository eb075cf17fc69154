"""The faults loadtest/reliability.py puts a launcher through, each returning what it saw and how long recovery took:
a restart (SIGTERM, drain, a new launcher), tritonserver killed, a stub killed, oversized HTTP bodies, and
tritonserver hung: alive but answering nothing, as Triton 2.51 was seen to hang (a SIGSEGV under its own tracing,
then no answers and no exit). SIGSTOP stands in for that; the launcher's canary (serving/launcher/canary.py) must find
it, turn /live 503, kill it and start it again. With engine.options.shared_process, the stubs' engine process killed
or hung the same way (stages/engines/shared.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections import Counter

from common.contract import engine_process_files
from serving.launcher.harness import Launcher

# Content types tritonserver's HTTP reads an inference body with (none at all is what some clients send).
CONTENT_TYPES = [None, "application/json", "application/octet-stream", "application/x-www-form-urlencoded"]


def launcher_live(health_port: int) -> tuple[int, dict]:
    """(HTTP status, body) of the launcher's /live; (0, {}) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/live", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}


def hang_tritonserver(launcher: Launcher, timeout_s: float = 180.0) -> dict:
    """SIGSTOP tritonserver; wait until /live said 503 and /ready is 200 again with another tritonserver."""
    old = launcher.triton_pid
    os.kill(old, signal.SIGSTOP)
    stopped = time.monotonic()
    live_503_s, problems = None, []
    while True:
        elapsed = time.monotonic() - stopped
        if elapsed > timeout_s:
            raise RuntimeError(f"the stopped tritonserver was not replaced within {timeout_s:.0f} s")
        if live_503_s is None:
            status, body = launcher_live(launcher.ports.health)
            if status == 503:
                live_503_s, problems = round(elapsed, 3), body.get("problems", [])
        elif launcher.ready()[0] == 200 and launcher.triton_pid != old:
            break
        time.sleep(0.05)
    return {
        "stopped_pid": old,
        "live_503_after_s": live_503_s,
        "live_problems": problems,
        "ready_again_s": round(time.monotonic() - stopped, 3),
        "tritonserver_restarts": launcher.ready()[1].get("tritonserver_restarts"),
    }


def kill_stub(launcher: Launcher, model: str, timeout_s: float = 120.0) -> dict:
    """SIGKILL one stub of `model`; wait until /ready went 503 and came back to 200."""
    before = launcher.stub_pids(model)
    os.kill(before[0], signal.SIGKILL)
    killed = time.monotonic()
    saw_unready, problems = False, []
    while time.monotonic() - killed < timeout_s:
        status, body = launcher.ready()
        if status == 503:
            saw_unready, problems = True, body.get("problems", problems)
        elif status == 200 and saw_unready:
            restarts = [r for r in body.get("stub_restarts", []) if r["model"] == model]
            ready_again_s = round(time.monotonic() - killed, 3)
            # The old version's stubs are still exiting when the new one is ready: count once they are gone.
            expected, settle = launcher.expected_stubs(model), time.monotonic() + 30
            while len(launcher.stub_pids(model)) != expected and time.monotonic() < settle:
                time.sleep(0.1)
            return {
                "model": model,
                "killed_pid": before[0],
                "ready_503_seen": True,
                "problems_reported": problems,
                "ready_again_s": ready_again_s,
                "watchdog_reload_s": restarts[-1]["seconds"] if restarts else None,
                "stubs_after": len(launcher.stub_pids(model)),
                "stubs_expected": expected,
            }
        time.sleep(0.02)
    raise RuntimeError(f"{model}: /ready did not go 503 and back to 200 within {timeout_s:.0f} s")


def crash_tritonserver(launcher: Launcher, timeout_s: float = 180.0) -> dict:
    """SIGKILL tritonserver (as a segfault would end it); the launcher starts it again: until /ready is 200."""
    old = launcher.triton_pid
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    while launcher.ready()[0] == 200 and time.monotonic() - killed < 10:
        time.sleep(0.01)
    while launcher.ready()[0] != 200:
        if time.monotonic() - killed > timeout_s:
            raise RuntimeError(f"tritonserver was not started again within {timeout_s:.0f} s")
        time.sleep(0.05)
    return {
        "killed_pid": old,
        "ready_again_s": round(time.monotonic() - killed, 3),
        "tritonserver_restarts": launcher.ready()[1].get("tritonserver_restarts"),
    }


def oversized_bodies(launcher: Launcher, max_body_bytes: int) -> dict:
    """HTTP bodies over front.max_body_bytes with each content type Triton reads, to an existing and an
    unknown model, and the body that crashes tritonserver 2.51 when it reaches it (form-typed, over 4 MiB):
    what each was answered, and whether tritonserver lived through them."""
    triton = launcher.triton_pid
    answers: Counter = Counter()
    sent = [(b"x" * (max_body_bytes + 1), content_type) for content_type in CONTENT_TYPES]
    sent.append((b"x" * (5 << 20), "application/x-www-form-urlencoded"))
    for body, content_type in sent:
        for model in ("ensemble", "no_such_model"):
            headers = {"Content-Type": content_type} if content_type else {}
            request = urllib.request.Request(
                f"http://127.0.0.1:{launcher.ports.http}/v2/models/{model}/infer", body, headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    answers[response.status] += 1
            except urllib.error.HTTPError as exc:
                answers[exc.code] += 1
            except OSError as exc:
                answers[type(exc).__name__] += 1
    return {
        "bodies": len(sent) * 2,
        "answers": {str(status): count for status, count in sorted(answers.items(), key=str)},
        "tritonserver_survived": launcher.triton_pid == triton,
    }


def restart(launcher: Launcher, timeout_s: float = 180.0) -> tuple[Launcher, dict]:
    """SIGTERM the launcher (Triton drains in-flight work), wait for it to exit, start a new one."""
    started = time.monotonic()
    launcher.terminate()
    code = launcher.process.wait(timeout=timeout_s)
    exited = time.monotonic()
    fresh = Launcher(launcher.settings_path, launcher.repository, launcher.ports, launcher.log_path).start(timeout_s)
    return fresh, {
        "launcher_exit_code": code,
        "drain_s": round(exited - started, 3),
        "ready_again_s": round(time.monotonic() - started, 3),
    }


def engine_process_pids(launcher: Launcher) -> dict[str, int]:
    """Each engine process of the launcher's tritonserver: its files' stem -> its pid (from its .ready file)."""
    found = {}
    for path in engine_process_files(launcher.triton_pid, ".ready"):
        with contextlib.suppress(OSError, ValueError):  # ended, or being started, meanwhile
            found[path.stem] = int(path.read_text())
    return found


def engine_process_fault(launcher: Launcher, fault: signal.Signals, timeout_s: float = 180.0) -> dict:
    """SIGKILL the engine processes (the stubs' next calls start them again and send what they had not answered) or
    SIGSTOP them (hung: the canary has the models' stubs killed and reloaded, and the first reloaded stub to connect
    ends it and starts another); wait until each is a new process again and /ready is 200."""
    before = engine_process_pids(launcher)
    if not before:
        raise RuntimeError("no engine process runs: the settings' engine.options have no shared_process = true")
    for pid in before.values():
        os.kill(pid, fault)
    hit = time.monotonic()
    while True:
        now = engine_process_pids(launcher)
        if all(now.get(stem, pid) != pid for stem, pid in before.items()) and launcher.ready()[0] == 200:
            break
        if time.monotonic() - hit > timeout_s:
            raise RuntimeError(f"the engine processes {sorted(before.values())} were not replaced in {timeout_s:.0f} s")
        time.sleep(0.05)
    return {
        "signal": fault.name,
        "engine_pids": sorted(before.values()),
        "replaced_by": sorted(now.values()),
        "ready_again_s": round(time.monotonic() - hit, 3),
    }
