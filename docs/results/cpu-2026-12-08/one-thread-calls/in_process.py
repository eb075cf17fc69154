# In-process: the stage core (tests/model/stage_run.py) on the default export, torch bf16 with THREADS (argv[1]),
# batches of 1, 4, 16 and 64 corpus texts, 60 ms apart (as a lane between queries): CPU and wall a call.
import time, sys
from pathlib import Path
from model_repository.stages.engines import load_engine
from tests.model.stage_run import stage, request
from loadtest.corpus import load_text
d = Path("build/repository/ensemble/1")
threads = int(sys.argv[1])
core = stage(d, engine=load_engine("torch", d, "cpu", {"threads": threads, "precision": "bf16"}))
texts = load_text()
for n in (1, 4, 16, 64):
    core.answer([request(texts[i:i+1]) for i in range(n)])
    walls, c0, tokens = [], time.process_time(), 0
    reps = 20 if n < 16 else 6
    for r in range(reps):
        w0 = time.perf_counter(); out = core.answer([request(texts[(r*n+i)%4000:(r*n+i)%4000+1]) for i in range(n)]); walls.append(time.perf_counter() - w0)
        tokens += sum(int(o["tokens"].sum()) for o in out)
        time.sleep(0.06)
    c1 = time.process_time(); walls.sort()
    print(f"threads {threads} batch {n} ({tokens/reps:.0f} tokens): CPU {1000*(c1-c0)/reps:.1f} ms, wall p50 {1000*walls[len(walls)//2]:.1f} ms", flush=True)
