"""How many cores this process may use, and how many API front workers follow from them (api.workers = 0).

The usable cores are those the scheduler lets this process run on (its affinity), fewer where a cgroup v2 CPU
limit (a container's resources.limits.cpu) allows less time than that: a pod limited to 4 CPUs on a 64-core
node counts 4.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # "<quota> <period>" in microseconds, or "max <period>": no limit
# API front workers per usable core. On the H200's 16 cores (2026-12-02, BERT-base, /v1/embeddings at c=256,
# docs/api.md) 6 workers served 17,604 req/s, 10 served 14,775 and 14 served 12,199: each worker coalesces fewer
# texts per Triton call the more there are, and the stubs need cores of their own.
API_WORKERS_PER_CORE = 3 / 8


def usable_cores(cpu_max: Path = CPU_MAX) -> int:
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit readable here
    return max(1, cores)


def api_workers(setting: int, cores: int | None = None) -> int:
    """api.workers as set, or with 0, API_WORKERS_PER_CORE of the usable cores (at least 1)."""
    if setting > 0:
        return setting
    return max(1, math.floor((cores or usable_cores()) * API_WORKERS_PER_CORE))
