"""The hang phase of loadtest/reliability.py: tritonserver alive but answering nothing, as Triton 2.51 was seen to
hang (a SIGSEGV under its own tracing, then no answers and no exit). SIGSTOP stands in for it; the launcher's
canary (serving/launcher/canary.py) must find it, turn /live 503, kill it and start it again."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

from serving.launcher.harness import Launcher


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
