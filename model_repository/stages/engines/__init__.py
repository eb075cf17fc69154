"""The engines a Python stage runs, by `engine.kind`: each behind base.Engine, each listed here once.

Every engine module is imported only when its kind is asked for: the CPU image has no torch, the GPU image
needs no ONNX Runtime. settings.schema.ENGINE_KINDS is these kinds plus `tensorrt`, which is no Python
engine but a `tensorrt_plan` model served by Triton's TensorRT backend (the two_stage topology), and `auto`,
which the stage turns into one of these when it loads (common/engine_choice.py); tests/unit/test_layers.py
holds the two lists together.

A new engine: a module here with an Engine subclass, one entry in ENGINES, its kind in ENGINE_KINDS and its
files in model_repository/configs.py ENGINE_FILES.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from common.contract import ServingSpec

from .base import Engine


def _onnxruntime_cpu() -> type[Engine]:
    from .onnxruntime_cpu import OnnxRuntimeCpuEngine

    return OnnxRuntimeCpuEngine


def _torch() -> type[Engine]:
    from .torch_engine import TorchEngine

    return TorchEngine


# kind -> the Engine class, imported on first use.
ENGINES: dict[str, Callable[[], type[Engine]]] = {
    "onnxruntime_cpu": _onnxruntime_cpu,  # fp32 on the CPU, the exported ONNX model in padded chunks
    "torch": _torch,  # packed tokens on a GPU (fp16/bf16) or on the CPU (fp32, bf16 GEMMs)
}


def load_engine(kind: str, model_dir: Path, device: str = "cpu", options: dict | None = None) -> Engine:
    """The `kind` engine for the exported model in model_dir, on `device` ("cpu" or "cuda:N")."""
    if kind not in ENGINES:
        raise ValueError(f"no Python engine of kind {kind!r}: the kinds are {', '.join(ENGINES)}")
    return ENGINES[kind]()(model_dir, ServingSpec.load(model_dir), device, options or {})
