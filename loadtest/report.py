"""The PNG of a run (requests/s, users and latency percentiles over time, from Locust's stats history CSV)
and the text printed after it."""

from __future__ import annotations

import csv
from pathlib import Path

PERCENTILES = ("50%", "95%", "99%")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "N/A" before the first response


def read_history(path: Path) -> list[dict]:
    """The Aggregated rows of <prefix>_stats_history.csv, as numbers (None where Locust wrote N/A)."""
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("Name") != "Aggregated":
                continue
            rows.append(
                {
                    "t": float(row["Timestamp"]),
                    "users": int(float(row["User Count"])),
                    "rps": _number(row["Requests/s"]),
                    "fail_per_s": _number(row["Failures/s"]),
                    "requests": int(float(row["Total Request Count"])),
                    **{p: _number(row.get(p, "")) for p in PERCENTILES},
                }
            )
    return rows


def interval_rps(rows: list[dict]) -> list[float | None]:
    """Requests/s between consecutive changes of the running total, at the row where it changed.

    With --processes the master's total moves only when a worker reports (every ~3 s), so per-row
    differences would alternate between 0 and a multiple of the rate; rows without a change get None.
    A reset of the stats (total going down) starts over."""
    out: list[float | None] = [None] * len(rows)
    last = 0
    for i in range(1, len(rows)):
        count = rows[i]["requests"] - rows[last]["requests"]
        if count < 0:
            last = i
        elif count > 0:
            span = rows[i]["t"] - rows[last]["t"]
            out[i] = count / span if span > 0 else None
            last = i
    return out


def plot(rows: list[dict], path: Path, title: str, p50_ms: float, p99_ms: float, steps=None) -> Path | None:
    """Two panels over the run: requests/s (per CSV interval) with the user count, and p50/p95/p99 (Locust's
    window of the last ~10 s) against the p50 and p99 bars; a ramp's measured step windows are shaded."""
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # a load-generator host without matplotlib still gets its verdict and CSVs
        print(f"loadtest: no PNG ({exc}); the CSV history has the same series")
        return None

    t0 = rows[0]["t"]
    seconds = [row["t"] - t0 for row in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    rate = [(second, rps) for second, rps in zip(seconds, interval_rps(rows), strict=True) if rps is not None]
    top.plot([second for second, _ in rate], [rps for _, rps in rate], "o-", ms=3, label="requests/s")
    if any(row["fail_per_s"] for row in rows):
        top.plot(seconds, [row["fail_per_s"] for row in rows], "r-", label="failures/s (Locust)")
    top.set(ylabel="requests/s", title=title)
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    users = top.twinx()
    users.step(seconds, [row["users"] for row in rows], "k--", where="post", lw=1, alpha=0.5, label="users")
    users.set(ylabel="users")
    users.set_ylim(bottom=0)
    handles = top.get_legend_handles_labels()[0] + users.get_legend_handles_labels()[0]
    top.legend(handles=handles, loc="lower right", fontsize=8)
    highest = 0.0
    for key, style in zip(PERCENTILES, ("o-", "s-", "^-"), strict=True):
        values = [row[key] if row[key] and row[key] > 0 else None for row in rows]
        highest = max([highest, *(v for v in values if v)])
        bottom.plot(seconds, values, style, ms=3, label=f"p{key.rstrip('%')}")
    for bar, color, name in ((p99_ms, "r", "p99"), (p50_ms, "g", "p50")):
        if highest == 0 or bar <= 2 * highest:
            bottom.axhline(bar, color=color, ls=":", lw=1.2, label=f"{name} bar {bar:g} ms")
        else:
            bottom.plot([], [], color=color, ls=":", label=f"{name} bar {bar:g} ms (off scale)")
    for step in steps or []:
        for axis in (top, bottom):
            axis.axvspan(step["start_wall"] - t0, step["end_wall"] - t0, color="0.92", zorder=0)
    bottom.set(xlabel="seconds", ylabel="ms (Locust, last ~10 s)")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def step_lines(steps: list[dict], knee: dict | None) -> list[str]:
    lines = [f"{'users':>7}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'failed':>8}"]
    for step in steps:
        mark = "  <- knee" if knee is not None and step["users"] == knee["users"] else ""
        lines.append(
            f"{step['users']:>7}{step['rps']:>10.1f}{step['p50_ms']:>9g}{step['p99_ms']:>9g}{step['failures']:>8}{mark}"
        )
    return lines
