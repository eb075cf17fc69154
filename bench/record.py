"""The fields every benchmark result file opens with: what ran, where and when."""

from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone


def header(benchmark: str, argv: list[str] | None) -> dict:
    """benchmark, date (UTC), machine and the command line of `python -m bench.<benchmark>`."""
    return {
        "benchmark": benchmark,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "command": f"python -m bench.{benchmark} " + " ".join(sys.argv[1:] if argv is None else argv),
    }
