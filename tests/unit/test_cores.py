"""settings/cores.py: the usable cores (affinity, a cgroup v2 CPU limit) and the API workers they give."""

from __future__ import annotations

import os

from settings.cores import api_workers, usable_cores


def test_a_set_worker_count_is_kept():
    assert api_workers(5, cores=64) == 5


def test_zero_follows_the_cores_three_of_every_eight():
    assert [api_workers(0, cores=n) for n in (1, 2, 4, 8, 16, 64)] == [1, 1, 1, 3, 6, 24]


def test_a_cgroup_limit_caps_the_usable_cores(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: two cores' worth of threads may run
    assert usable_cores(cpu_max) == min(2, len(os.sched_getaffinity(0)))
    cpu_max.write_text("max 100000\n")
    assert usable_cores(cpu_max) == len(os.sched_getaffinity(0))
    assert usable_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))
