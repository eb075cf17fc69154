"""Step ramp: add --step-users every --step-seconds until throughput stops following the users (the knee).

Load it beside the users: `locust -f loadtest/locustfile.py,loadtest/step_shape.py ...` (`python -m loadtest
--load ramp` does). Each step is measured after it settled (the first third of the step, at most 5 s, is
left out): requests/s, p50, p99 and failures of that window alone. The ramp stops after two steps in a
row that gained less than --knee-scaling of their linear share of throughput (unless --step-keep-going),
or at --step-max-users. The quitting listener in the locustfile reports every step, the knee and the
verdict: some step must meet the latency bar at >= min_rps.
"""

from __future__ import annotations

import math
import time

from locust import LoadTestShape
from locust.runners import MasterRunner
from locust.stats import calculate_response_time_percentile, diff_response_time_dicts

from loadtest.acceptance import find_knee

REPORT_LAG_S = 4  # a master hears from its workers every 3 s


def snapshot(entry) -> dict:
    return {
        "wall": time.time(),
        "requests": entry.num_requests - entry.num_none_requests,
        "failures": entry.num_failures,
        "total_ms": entry.total_response_time,
        "times": dict(entry.response_times),
    }


def window_rps(entry, start_wall: float, end_wall: float, lag_s: int = 0) -> float:
    """Requests per second over the whole seconds of [start, end), from Locust's per-second counts."""
    last = int(entry.stats.last_request_timestamp or end_wall) - lag_s
    seconds = [t for t in range(math.ceil(start_wall), int(end_wall)) if t < last]
    if not seconds:
        return 0.0
    return sum(entry.num_reqs_per_sec.get(t, 0) for t in seconds) / len(seconds)


class StepRamp(LoadTestShape):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict] = []
        self._index = -1
        self._users = 0
        self._mark: dict | None = None
        self._done = False

    def _options(self):
        options = self.runner.environment.parsed_options
        step = max(1, options.step_users)
        start = options.step_start_users or step
        return start, step, options.step_max_users, options.step_seconds

    def _close_step(self) -> None:
        """Measure the step that is ending, from its settle mark until now."""
        if self._mark is None:
            return
        entry = self.runner.stats.total
        end = snapshot(entry)
        requests = end["requests"] - self._mark["requests"]
        times = diff_response_time_dicts(end["times"], self._mark["times"])
        lag = REPORT_LAG_S if isinstance(self.runner, MasterRunner) else 0
        self.steps.append(
            {
                "users": self._users,
                "start_wall": round(self._mark["wall"], 3),
                "end_wall": round(end["wall"], 3),
                "requests": requests,
                "failures": end["failures"] - self._mark["failures"],
                "rps": round(window_rps(entry, self._mark["wall"], end["wall"], lag), 2),
                "p50_ms": calculate_response_time_percentile(times, requests, 0.5) if requests else 0,
                "p99_ms": calculate_response_time_percentile(times, requests, 0.99) if requests else 0,
                "mean_ms": round((end["total_ms"] - self._mark["total_ms"]) / requests, 2) if requests else 0.0,
            }
        )
        self._mark = None

    def _saturated(self, scaling: float) -> bool:
        """The last two steps both failed to scale."""
        if len(self.steps) < 3:
            return False
        return find_knee(self.steps[-2:], scaling) == 0 and find_knee(self.steps[-3:-1], scaling) == 0

    def tick(self):
        if self._done:
            return None
        start, step, top, seconds = self._options()
        run_time = self.get_run_time()
        index = int(run_time // seconds)
        if index != self._index:
            self._close_step()
            options = self.runner.environment.parsed_options
            users = start + index * step
            if users > top or (not options.step_keep_going and self._saturated(options.knee_scaling)):
                self._done = True
                return None
            self._index, self._users = index, users
        if self._mark is None and run_time >= self._index * seconds + min(seconds / 3, 5.0):
            self._mark = snapshot(self.runner.stats.total)
        return self._users, float(max(step, start))

    def finish(self, environment) -> list[dict]:
        """The measured steps, their requests/s recounted now that every worker has reported."""
        if not self._done:
            self._close_step()
            self._done = True
        entry = environment.stats.total
        for step in self.steps:
            step["rps"] = round(window_rps(entry, step["start_wall"], step["end_wall"]), 2)
        return self.steps
