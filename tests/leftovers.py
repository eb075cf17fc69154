"""What a test session leaves running: stubs and Python-backend shared memory (tests/conftest.py fails the run on
any). Standard library only, so that every suite's conftest can import it (the GPU tests run without Triton)."""

from __future__ import annotations

from pathlib import Path

from serving.launcher.shm import SHM_REGION_PREFIX, mapped_files


def stub_argvs(proc: Path = Path("/proc")) -> dict[int, list[str]]:
    """Every live Python-backend stub on this machine: pid -> its command line."""
    found = {}
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # ended meanwhile
        if argv[0].endswith(b"triton_python_backend_stub") and state not in ("Z", "X"):
            found[int(cmdline.parent.name)] = [arg.decode(errors="replace") for arg in argv if arg]
    return found


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
