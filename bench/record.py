"""A benchmark's result file: the fields it opens with (what ran, where and when), and writing it."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def header(benchmark: str, argv: list[str] | None) -> dict:
    """benchmark, date (UTC), machine and the command line of `python -m bench.<benchmark>`."""
    return {
        "benchmark": benchmark,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "command": f"python -m bench.{benchmark} " + " ".join(sys.argv[1:] if argv is None else argv),
    }


def write(out: Path, record: dict) -> Path:
    """out/<benchmark>.json, said on stdout."""
    path = out / f"{record['benchmark']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return path
