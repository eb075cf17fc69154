"""Probe: each API worker's garbage collections (count, total and largest pause a generation), written every 2 s to
/tmp/gcprobe/stats-<pid>.txt. Used as a sitecustomize: `mkdir -p /tmp/gcprobe && cp gc_pauses.py
/tmp/gcprobe/sitecustomize.py`, then run the bench with PYTHONPATH=/tmp/gcprobe (README.md). Only a process whose
command line runs `-m serving.api` is probed; the pauses are wall time, so preemption on shared cores counts too."""

import gc
import os
import threading
import time

with open("/proc/self/cmdline", "rb") as cmdline:
    probed = b"\0serving.api\0" in cmdline.read()

if probed:
    stats = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
            return
        spent = time.perf_counter() - started[0]
        entry = stats[info["generation"]]
        entry[0] += 1
        entry[1] += spent
        entry[2] = max(entry[2], spent)

    gc.callbacks.append(on_gc)

    def dump():
        while True:
            time.sleep(2)
            with open(f"/tmp/gcprobe/stats-{os.getpid()}.txt", "w") as out:
                out.write(
                    f"{time.time():.0f} objects={len(gc.get_objects())} frozen={gc.get_freeze_count()} "
                    + " ".join(
                        f"gen{g}: n={n} total_ms={t * 1e3:.1f} max_ms={m * 1e3:.2f}" for g, (n, t, m) in stats.items()
                    )
                    + "\n"
                )

    threading.Thread(target=dump, daemon=True).start()
