"""python summ.py DIR: per generator, c, route and arm (asyncio / uvloop), each round's req/s, p50 and the API
workers' CPU a request, from DIR/<arm>-<generator>-<round>.json (api_cost.json)."""

import collections
import glob
import json
import statistics
import sys
from pathlib import Path

rows = collections.defaultdict(list)
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    arm, generator, _round = Path(path).stem.split("-")
    for c, result in json.loads(Path(path).read_text())["results"].items():
        for route, runs in result["runs"].items():
            for run in runs:
                api_us = run["cpu_us_per_request"].get("api workers") or 0
                rows[(generator, c, route, arm)].append((run["rps"], run["p50_ms"], api_us))
for key, runs in sorted(rows.items()):
    rps, p50, api = zip(*runs, strict=True)
    medians = (
        f"median rps {statistics.median(rps):.1f} p50 {statistics.median(p50):.3f} api_us {statistics.median(api):.0f}"
    )
    print(*key, "rps", list(rps), "p50", list(p50), "api_us", [round(x) for x in api], medians)
