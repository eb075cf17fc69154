"""What a test session leaves running: stubs and Python-backend shared memory (tests/conftest.py fails the run on
any). Standard library and serving/launcher's procfs.py and shm.py only, so that every suite's conftest can import
it (the GPU tests run without Triton)."""

from __future__ import annotations

from pathlib import Path

from serving.launcher.procfs import stub_argvs
from serving.launcher.shm import SHM_REGION_PREFIX, mapped_files


def leftovers(before: tuple[set[int], set[str]], roots: list[Path], shm: Path = Path("/dev/shm")) -> list[str]:
    """What a test session started and left: stubs (not there at its start) whose files are under one of `roots`,
    and shared-memory regions (not there at its start) no live process maps."""
    stubs_before, regions_before = before
    found = [
        f"stub {pid}: {' '.join(argv[:2])}"
        for pid, argv in stub_argvs().items()
        if pid not in stubs_before and any(arg.startswith(str(root)) for root in roots for arg in argv[:2])
    ]
    mapped = mapped_files()
    found += [
        f"shared memory {region}"
        for region in sorted(shm.glob(f"{SHM_REGION_PREFIX}*"))
        if region.name not in regions_before and str(region) not in mapped
    ]
    return found
