"""serving/launcher/procfs.py, shm.py and bench/process_cpu.py on real processes and a real /dev/shm: finding a
parent's children, their CPU time and their busiest threads, and which Python-backend shared-memory regions are
orphans (the watchdog and the launcher's clean-up run against the real tritonserver in
tests/server/test_reliability.py and test_image_launcher.py)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench.process_cpu import busiest_threads, thread_cpu_s
from serving.launcher.procfs import child_processes, process_cpu_s, running
from serving.launcher.shm import SHM_REGION_PREFIX, mapped_files, remove_orphaned_shm, remove_regions

SHM = Path("/dev/shm")


@pytest.fixture()
def children():
    started = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", f"child-{i}"]) for i in range(3)]
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_child_processes_are_the_parents_children_with_their_argv(children):
    found = {pid: argv for pid, _, argv in child_processes(os.getpid())}
    for index, process in enumerate(children):
        assert found[process.pid][-2] == f"child-{index}".encode()  # argv ends with an empty string (NUL-split)
    grandchild_free = {pid for pid, _, _ in child_processes(children[0].pid)}
    assert grandchild_free == set()


def test_a_zombie_is_state_z_and_not_running(children):
    children[0].kill()
    time.sleep(0.2)  # not waited for: a zombie until reaped, as Triton leaves a dead stub
    states = {pid: state for pid, state, _ in child_processes(os.getpid())}
    assert states[children[0].pid] == "Z"
    assert not running(children[0].pid) and running(children[1].pid)
    children[0].wait()
    assert not running(children[0].pid), "reaped: gone from /proc"


def test_process_cpu_counts_busy_time_and_is_zero_for_the_gone():
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        time.sleep(1.0)
        assert 0.25 <= process_cpu_s(busy.pid) < 5
    finally:
        busy.kill()
        busy.wait()
    assert process_cpu_s(busy.pid) == 0.0


BUSY_THREAD = """
import threading, time
def spin():
    while True:
        pass
busy = threading.Thread(target=spin, daemon=True)
busy.start()
print(busy.native_id, flush=True)
time.sleep(30)
"""


def test_busiest_threads_names_the_one_thread_that_spins():
    process = subprocess.Popen([sys.executable, "-c", BUSY_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        spinning = int(process.stdout.readline())
        before, start = thread_cpu_s(process.pid), time.monotonic()
        time.sleep(1.0)
        threads = busiest_threads(before, thread_cpu_s(process.pid), time.monotonic() - start)
        assert threads[0]["tid"] == spinning
        assert threads[0]["cores_busy"] >= 0.5
        assert all(thread["cores_busy"] < 0.2 for thread in threads[1:])  # the main thread sleeps
    finally:
        process.kill()
        process.wait()


def region(age_s: float) -> Path:
    path = SHM / f"{SHM_REGION_PREFIX}test_{uuid.uuid4().hex}"
    path.write_bytes(b"\0" * 4096)
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_only_old_unmapped_regions_are_orphans():
    orphan, young, held = region(60), region(0), region(60)
    with held.open("r+b") as file, mmap.mmap(file.fileno(), 4096) as mapping:
        assert str(held) in mapped_files()
        removed = remove_orphaned_shm()
        assert orphan.name in removed and not orphan.exists()
        assert young.exists() and held.exists(), "a region being set up, and one a live process maps, stay"
        mapping[0] = 1
    remove_regions({young.name, held.name})
    assert not young.exists() and not held.exists()
    remove_regions({held.name})  # gone already: nothing to do, no error
