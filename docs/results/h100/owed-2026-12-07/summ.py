"""Summarize priority_bench.json files under a folder: one line a tree, then its deadline phases."""

import json
import pathlib
import sys

for path in sorted(pathlib.Path(sys.argv[1]).glob("*/priority_bench.json")):
    lanes = json.loads(path.read_text())["modes"]["lanes"]
    print(
        path.parent.name,
        "q p99",
        f"{lanes['queries_alone']['p99_ms']}->{lanes['queries_beside_ingestion']['p99_ms']}",
        "ing",
        lanes["ingestion_alone"]["texts_per_s"],
        lanes["ingestion_beside_queries"]["texts_per_s"],
    )
    for phase in ("deadlines", "deadlines_8_processes"):
        if phase in lanes:
            keys = (
                "within_bound",
                "p50_ms",
                "max_ms",
                "answered_504",
                "answered_200",
                "refused_by_stage",
                "rows_run_unanswered",
            )
            print("  ", phase, {key: lanes[phase].get(key) for key in keys})
