"""Summarize priority_bench.json files under a folder: one line a tree, then its deadline phases."""
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*/priority_bench.json")):
    m = json.load(open(f))["modes"]["lanes"]
    print(f.parent.name, "q p99", f"{m['queries_alone']['p99_ms']}->{m['queries_beside_ingestion']['p99_ms']}",
          "ing", m["ingestion_alone"]["texts_per_s"], m["ingestion_beside_queries"]["texts_per_s"])
    for k in ("deadlines", "deadlines_8_processes"):
        if k in m:
            d = m[k]
            print("  ", k, {x: d.get(x) for x in ("within_bound", "p50_ms", "max_ms", "answered_504", "answered_200",
                                                 "refused_by_stage", "rows_run_unanswered")})
