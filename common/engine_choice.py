"""engine.kind / engine.precision "auto": which engine and precision a stage runs, decided from the machine it runs on.

On a GPU: torch at fp16. On a CPU whose instructions multiply bf16 natively (AMX, or AVX-512 BF16): torch with
bf16 GEMM operands, when torch is installed (2026-12-02, 2 cores of a Zen 4: served 1.9-2.2x sentence-transformers
against onnxruntime_cpu's 1.2-1.4x, cosine >= 0.99995; docs/benchmarks.md, CPU default). Anywhere else:
onnxruntime_cpu at fp32, the faster fp32 engine on a CPU. fp32 stays one setting away (engine.precision = "fp32")
for results that do not depend on how requests were batched (bf16 rows differ by up to ~1e-3 between batchings).

The stage decides when it loads (model_repository/stages/model_args.py) and logs the choice; the API front's
/info asks the same function, which gives the same answer in every process of one machine and environment:
it reads only the CPU's flags and whether torch is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

# CPU flags (/proc/cpuinfo) with native bf16 multiply-accumulate: Intel AMX tiles, or AVX-512 BF16 (Intel Cooper
# Lake and later, AMD Zen 4 and later).
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    kind: str
    precision: str
    reason: str

    def describe(self) -> str:
        return f"engine {self.kind}, precision {self.precision} ({self.reason})"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags; empty where /proc/cpuinfo is not there (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def choose_engine(
    kind: str, precision: str, on_gpu: bool, flags: frozenset[str] | None = None, has_torch: bool | None = None
) -> EngineChoice:
    """What `kind` and `precision` (either may be "auto") mean on this machine; flags and has_torch default to
    this machine's (tests pass their own)."""
    if kind != "auto" and precision != "auto":
        return EngineChoice(kind, precision, "as set")
    if on_gpu:
        return EngineChoice("torch" if kind == "auto" else kind, "fp16" if precision == "auto" else precision, "GPU")
    flags = cpu_flags() if flags is None else flags
    has_torch = torch_installed() if has_torch is None else has_torch
    bf16 = next((flag for flag in BF16_FLAGS if flag in flags), None)
    if kind == "onnxruntime_cpu":
        return EngineChoice(kind, "fp32", "ONNX Runtime runs fp32")
    if kind == "torch":
        return EngineChoice(kind, "bf16" if bf16 else "fp32", f"the CPU has {bf16}" if bf16 else "no bf16 on this CPU")
    if precision == "fp32":
        return EngineChoice("onnxruntime_cpu", "fp32", "the faster fp32 engine on a CPU")
    if precision == "bf16":
        if not has_torch:
            raise ValueError('engine.precision "bf16" on a CPU needs torch, which is not installed here')
        return EngineChoice("torch", "bf16", "bf16 as set")
    if bf16 and has_torch:
        return EngineChoice("torch", "bf16", f"the CPU has {bf16}")
    reason = f"the CPU has {bf16} but torch is not installed" if bf16 else "no bf16 on this CPU"
    return EngineChoice("onnxruntime_cpu", "fp32", reason)
