"""The stage core (tests/model/stage_run.py) on the default export, torch bf16 on THREADS threads (argv[1]): batches
of 1, 4, 16 and 64 corpus texts, 60 ms apart (as a lane's calls between queries), CPU and wall p50 a call."""

import sys
import time
from pathlib import Path

from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from tests.model.stage_run import request, stage

export = Path("build/repository/ensemble/1")
threads = int(sys.argv[1])
core = stage(export, engine=load_engine("torch", export, "cpu", {"threads": threads, "precision": "bf16"}))
texts = load_text()
for n in (1, 4, 16, 64):
    core.answer([request(texts[i : i + 1]) for i in range(n)])
    walls, cpu, tokens = [], time.process_time(), 0
    reps = 20 if n < 16 else 6
    for r in range(reps):
        batch = [request(texts[(r * n + i) % 4000 : (r * n + i) % 4000 + 1]) for i in range(n)]
        started = time.perf_counter()
        answers = core.answer(batch)
        walls.append(time.perf_counter() - started)
        tokens += sum(int(answer["tokens"].sum()) for answer in answers)
        time.sleep(0.06)
    cpu = time.process_time() - cpu
    walls.sort()
    print(f"threads {threads} batch {n} ({tokens / reps:.0f} tokens): CPU {1000 * cpu / reps:.1f} ms, "
          f"wall p50 {1000 * walls[len(walls) // 2]:.1f} ms", flush=True)  # fmt: skip
