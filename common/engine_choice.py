"""engine.kind / engine.precision "auto": which engine and precision a stage runs, decided from the machine it runs on
and the model's task.

On a GPU: torch at fp16. On a CPU whose instructions multiply bf16 natively (AMX, or AVX-512 BF16): torch with
bf16 GEMM operands, when torch is installed (2026-12-02, 2 cores of a Zen 4: served 1.9-2.2x sentence-transformers
against onnxruntime_cpu's 1.2-1.4x, cosine >= 0.99995; docs/benchmarks.md, CPU default). Anywhere else:
onnxruntime_cpu at fp32, the faster fp32 engine on a CPU. fp32 stays one setting away (engine.precision = "fp32")
for results that do not depend on how requests were batched (bf16 rows differ by up to ~1e-3 between batchings).

Task sparse (SPLADE) runs fp32 everywhere (onnxruntime_cpu on a CPU, torch on a GPU): its bar is that each text's
terms above 1 % of its largest weight are the reference's (fp32 SparseEncoder), as a set and in order of weight, and
a text's hundreds of weights lie closer together than bf16 or fp16 rounding moves them
(docs/results/cpu-2026-12-04/sparse-precision).

The stage decides when it loads (model_repository/stages/model_args.py) and logs the choice; the API front's
/info asks the same function, which gives the same answer in every process of one machine and environment:
it reads only the task, the CPU's flags and whether torch is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

# CPU flags (/proc/cpuinfo) with native bf16 multiply-accumulate: Intel AMX tiles, or AVX-512 BF16 (Intel Cooper
# Lake and later, AMD Zen 4 and later).
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# Tasks served at fp32 whatever the machine. sparse: on 2 Zen 5 cores, 2026-12-04, bf16 GEMMs changed the set or
# the order of the terms above 1 % of the max for every text of a random BERT-base SPLADE (a bf16 encoder under an
# fp32 MLM head too), and the reference's own logits rounded to fp16, as a GPU's fp16 decoder GEMM stores them,
# leave pairs the reference sets apart unordered; torch and onnxruntime_cpu at fp32 hold it for every text, and
# onnxruntime_cpu is the faster of the two there too. On a GPU the fp32 figure is unmeasured
# (python -m bench.sparse_bench --device cuda measures it): the torch engine's Triton attention runs its fp32 dots
# in TF32 by Triton's default, which broke the bar when emulated on the CPU.
FP32_TASKS = ("sparse",)


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
    kind: str,
    precision: str,
    on_gpu: bool,
    task: str,
    flags: frozenset[str] | None = None,
    has_torch: bool | None = None,
) -> EngineChoice:
    """What `kind` and `precision` (either may be "auto") mean on this machine for a model of `task`; flags and
    has_torch default to this machine's (tests pass their own)."""
    if kind != "auto" and precision != "auto":
        return EngineChoice(kind, precision, "as set")
    exact = task in FP32_TASKS and precision == "auto"
    if on_gpu:
        gpu_precision, reason = ("fp32", f"GPU, task {task} runs fp32") if exact else ("fp16", "GPU")
        return EngineChoice(
            "torch" if kind == "auto" else kind, gpu_precision if precision == "auto" else precision, reason
        )
    flags = cpu_flags() if flags is None else flags
    has_torch = torch_installed() if has_torch is None else has_torch
    bf16 = next((flag for flag in BF16_FLAGS if flag in flags), None)
    if kind == "onnxruntime_cpu":
        return EngineChoice(kind, "fp32", "ONNX Runtime runs fp32")
    if kind == "torch":
        if exact:
            return EngineChoice(kind, "fp32", f"task {task} runs fp32")
        return EngineChoice(kind, "bf16" if bf16 else "fp32", f"the CPU has {bf16}" if bf16 else "no bf16 on this CPU")
    if precision == "fp32" or exact:
        why = "the faster fp32 engine on a CPU"
        return EngineChoice("onnxruntime_cpu", "fp32", f"task {task} runs fp32, {why}" if exact else why)
    if precision == "bf16":
        if not has_torch:
            raise ValueError('engine.precision "bf16" on a CPU needs torch, which is not installed here')
        return EngineChoice("torch", "bf16", "bf16 as set")
    if bf16 and has_torch:
        return EngineChoice("torch", "bf16", f"the CPU has {bf16}")
    reason = f"the CPU has {bf16} but torch is not installed" if bf16 else "no bf16 on this CPU"
    return EngineChoice("onnxruntime_cpu", "fp32", reason)


def shares_engine_process(options: dict) -> bool:
    """Whether the settings' [engine] options (or a stage's copy of them) ask for one engine process a device
    (shared_process = true: stages/engines/shared.py)."""
    return str(options.get("shared_process", "false")).lower() in ("true", "1")
