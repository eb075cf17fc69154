"""The Python backend's shared-memory regions in /dev/shm (16 MiB per stub): a killed stub or tritonserver leaves
its regions behind, so the launcher removes them."""

from __future__ import annotations

import time
from pathlib import Path

SHM_REGION_PREFIX = "triton_python_backend_shm_region_"


def mapped_files(proc: Path = Path("/proc")) -> set[str]:
    """Every file some live process has mapped (the last field of /proc/PID/maps)."""
    mapped = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            mapped.update(line.split(None, 5)[5].strip() for line in maps.read_text().splitlines() if "/" in line)
        except (OSError, IndexError):
            continue  # the process ended meanwhile, or a line without a path
    return mapped


def remove_orphaned_shm(shm: Path = Path("/dev/shm"), min_age_s: float = 10.0) -> list[str]:
    """Delete the Python backend's shared-memory regions no live process maps (16 MiB each, left behind by
    every stub and tritonserver that was killed); a region younger than min_age_s may be one being set up."""
    mapped, removed, now = mapped_files(), [], time.time()
    for region in shm.glob(f"{SHM_REGION_PREFIX}*"):
        try:
            if str(region) not in mapped and now - region.stat().st_mtime > min_age_s:
                region.unlink()
                removed.append(region.name)
        except OSError:
            continue  # removed by someone else meanwhile
    return removed


def remove_regions(names: set[str], shm: Path = Path("/dev/shm")) -> None:
    for name in names:
        if name.startswith(SHM_REGION_PREFIX):
            (shm / name).unlink(missing_ok=True)
