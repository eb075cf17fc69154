"""The API front's counter files: a stopped front leaves no folder in the temporary directory, whatever order its
workers stop in, and a worker never takes the counts of a sibling that still runs."""

from __future__ import annotations

import os
import subprocess
import sys

from serving.api.call_stats import CallStats


def _finished_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_last_worker_to_stop_removes_the_folder_and_its_dead_predecessors_counts(tmp_path):
    stats = CallStats(9, ["ensemble"], tmp_path)
    stats.count("ensemble", texts=3, requests=1)
    (stats.folder / f"{_finished_pid()}.u64").write_bytes(bytes(8))  # a worker that crashed and was replaced
    stats.close()
    assert not stats.folder.exists()
    assert not list(tmp_path.iterdir())


def test_a_stopping_worker_leaves_a_running_siblings_counts(tmp_path):
    stats = CallStats(9, ["ensemble"], tmp_path)
    sibling = stats.folder / f"{os.getppid()}.u64"  # a live process standing for a sibling worker
    sibling.write_bytes(bytes(8))
    stats.close()
    assert [path.name for path in stats.folder.iterdir()] == [sibling.name]
