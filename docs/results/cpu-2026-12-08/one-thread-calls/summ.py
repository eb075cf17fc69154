import json, statistics
rows = {}
for gen in ("perf_analyzer", "python"):
    for r in (1, 2):
        for arm in ("main", "new"):
            d = json.load(open(f"runs/{arm}-{gen}-{r}.json"))["results"]
            for c, cell in d.items():
                for route, runs in cell["runs"].items():
                    run = runs[0]
                    stub = max(v for k, v in run["cpu_us_per_request"].items() if "stubs" in k)
                    rows.setdefault((gen, c, route), {}).setdefault(arm, []).append(
                        (run["rps"], run["p50_ms"], stub / 1000, run["cpu_us_per_request"]["host"] / 1000))
print("| generator | c | route | main: req/s, p50 ms, stub CPU ms a request (2 rounds) | one thread under 128 tokens |")
print("| --- | ---: | --- | --- | --- |")
for (gen, c, route), arms in rows.items():
    f = lambda xs: "; ".join(f"{a:.0f}, {b:.2f}, {s:.1f}" for a, b, s, h in xs)
    print(f"| {gen} | {c[2:]} | {route} | {f(arms['main'])} | {f(arms['new'])} |")
