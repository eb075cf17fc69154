"""What the in-process benchmarks of a task's engines against its reference library share (sparse_bench,
multi_vector_bench, hybrid_bench): their command line, the record's header, batches, and the timing and peak
memory of a runner."""

from __future__ import annotations

import argparse
import ctypes
import os
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import torch

from bench.record import header
from model_repository.stages.engines import load_engine

CLEAR_REFS = Path("/proc/self/clear_refs")
MEMORY = {
    "VmHWM": "resident set: VmHWM (reset by clear_refs 5) over VmRSS",
    "tracemalloc": "tracemalloc (/proc/self/clear_refs not writable): Python and numpy allocations only",
    "cuda": "torch.cuda.max_memory_allocated over memory_allocated",
}


def status(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


class PeakGrowth:
    """Peak memory in a window over a base: the base taken once a runner is loaded, so that working memory an
    allocator keeps from the untimed pass counts (glibc keeps freed chunks under 32 MB, ORT its arena)."""

    def __init__(self, device: str) -> None:
        self.method = "cuda" if device == "cuda" else "VmHWM"
        if device == "cpu":
            try:
                CLEAR_REFS.write_text("5")
            except OSError:
                self.method = "tracemalloc"

    def loaded(self) -> None:
        if self.method == "tracemalloc":
            tracemalloc.stop()  # drops the last runner's traces
            tracemalloc.start()
        self.base = 0  # tracemalloc: counted from start()
        if self.method == "VmHWM":  # the last runner's freed heap would stay resident and hide this one's use of it
            ctypes.CDLL(None).malloc_trim(0)
            self.base = status("VmRSS")
        elif self.method == "cuda":
            self.base = torch.cuda.memory_allocated()

    def reset(self) -> None:
        if self.method == "VmHWM":
            CLEAR_REFS.write_text("5")
        elif self.method == "tracemalloc":
            tracemalloc.reset_peak()
        else:
            torch.cuda.reset_peak_memory_stats()

    def growth(self) -> int:
        if self.method == "VmHWM":
            return status("VmHWM") - self.base
        if self.method == "cuda":
            return torch.cuda.max_memory_allocated() - self.base
        return tracemalloc.get_traced_memory()[1]


REFERENCE = "sentence_transformers"


def runner_names(device: str) -> list[str]:
    """The reference library first, then the engines the stage runs on `device` (onnxruntime_cpu on the CPU)."""
    return [REFERENCE, "torch", *(["onnxruntime_cpu"] if device == "cpu" else [])]


def load_runner(name: str, reference: Callable[[], object], folder: Path, device: str, options: dict):
    """The reference (`reference()` builds it) or the engine `name` loaded with the options the stage passes
    (model_repository/configs.py: precision, threads and the settings' [engine] options)."""
    return reference() if name == REFERENCE else load_engine(name, folder, device, options)


def split(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def measure(call, batches: list, passes: int, memory: PeakGrowth) -> tuple[object, dict]:
    """(the first batch's output, texts/s and memory): an untimed pass first, so that every batch shape has been
    seen (CUDA graphs captured, arenas grown) before the timed ones."""
    first = call(batches[0])
    for batch in batches[1:]:
        call(batch)
    sync = torch.cuda.synchronize if memory.method == "cuda" else lambda: None
    sync()
    memory.reset()
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        for batch in batches:
            call(batch)
        sync()
        seconds.append(time.perf_counter() - started)
    rate = sum(map(len, batches)) / min(seconds)
    return first, {"texts_per_s": rate, "pass_s": seconds, "peak_growth_bytes": memory.growth()}


def add_run_arguments(parser: argparse.ArgumentParser, batch: str | None) -> None:
    """--device, --out, --batch (default `batch`, else 32 on the CPU and 64,1 on CUDA), --texts, --passes, --threads,
    --tokenizer."""
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--batch", default=batch, help="batch sizes, comma-separated (default 32 on the CPU, 64,1 on CUDA)"
    )
    parser.add_argument("--texts", type=int, default=1024, help="corpus texts per pass")
    parser.add_argument("--passes", type=int, default=3, help="timed passes; the best counts")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of every runner")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json of the preset (default: its export's own)")


def batch_sizes(args: argparse.Namespace) -> list[int]:
    return [int(size) for size in (args.batch or ("32" if args.device == "cpu" else "64,1")).split(",")]


def run_record(benchmark: str, argv: list[str] | None, args: argparse.Namespace, memory: PeakGrowth) -> dict:
    """The record's header: the machine, the command, the device, torch's version, the run's settings."""
    return header(benchmark, argv) | {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "precision": "fp32" if args.device == "cpu" else "fp16",
        **{"threads": args.threads, "passes": args.passes},
        "memory": MEMORY[memory.method],
    }
