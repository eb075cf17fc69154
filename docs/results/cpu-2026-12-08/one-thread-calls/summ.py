"""The README's table from runs/<arm>-<generator>-<round>.json (bench.api_cost)."""

import json
from pathlib import Path

rows: dict = {}
for generator in ("perf_analyzer", "python"):
    for round_ in (1, 2):
        for arm in ("main", "new"):
            results = json.loads(Path(f"runs/{arm}-{generator}-{round_}.json").read_text())["results"]
            for cell_name, cell in results.items():
                for route, runs in cell["runs"].items():
                    run = runs[0]
                    stubs = max(value for key, value in run["cpu_us_per_request"].items() if "stubs" in key)
                    cells = rows.setdefault((generator, cell_name, route), {}).setdefault(arm, [])
                    cells.append((run["rps"], run["p50_ms"], stubs / 1000))


def listed(cells: list) -> str:
    return "; ".join(f"{rps:.0f}, {p50:.2f}, {stubs:.1f}" for rps, p50, stubs in cells)


print("| generator | c | route | main: req/s, p50 ms, stub CPU ms a request (2 rounds) | one thread under 128 tokens |")
print("| --- | ---: | --- | --- | --- |")
for (generator, cell_name, route), arms in rows.items():
    print(f"| {generator} | {cell_name[2:]} | {route} | {listed(arms['main'])} | {listed(arms['new'])} |")
