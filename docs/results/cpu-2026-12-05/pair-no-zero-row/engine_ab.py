"""The torch engine of one tree's code on the CPU (bf16 GEMMs, 2 threads): ms per batch at 8, 32 and 128 texts.

    python engine_ab.py TREE MODEL_DIR

TREE: a folder holding model_repository/ and common/ (this tree, or a `git archive` of another commit); MODEL_DIR:
an export (build/models/all-MiniLM-L6-v2). Lengths as bench/engine_bench.py draws them (a lognormal of mean 45,
clipped to 8-128), seed 7, four batches per size, each run once untimed. The first batch's rows are saved to
/tmp/engine_ab_<tree folder's name>.npy, so that two trees' answers can be compared.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

tree, model = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)

from model_repository.stages.engines import load_engine  # noqa: E402

engine = load_engine("torch", Path(model), "cpu", {"precision": "bf16", "threads": 2})
rng = np.random.default_rng(7)
timings = {}
for size, rounds in ((8, 40), (32, 15), (128, 4)):
    batches = []
    for _ in range(4):
        lengths = np.clip(np.round(rng.lognormal(np.log(45) - 0.125, 0.5, size)), 8, 128).astype(np.int32)
        batches.append((rng.integers(1000, 20000, lengths.sum()).astype(np.int32), lengths))
    for ids, lengths in batches:
        engine.forward_packed(ids, lengths)
    started = time.perf_counter()
    for _ in range(rounds):
        for ids, lengths in batches:
            engine.forward_packed(ids, lengths)
    timings[size] = round((time.perf_counter() - started) / (rounds * 4) * 1000, 3)
np.save(f"/tmp/engine_ab_{Path(tree).name}.npy", engine.forward_packed(*batches[0]))
print(Path(tree).name, json.dumps(timings))
