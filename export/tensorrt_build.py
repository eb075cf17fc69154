"""Build a TensorRT plan from an ONNX model and a build spec: `python3 -m export.tensorrt_build SPEC.json`.

Runs wherever TensorRT's Python bindings and a GPU are (an NGC TensorRT container, typically): it needs
only the standard library and `tensorrt`, no project settings, torch or onnx. The spec is written by
`python -m export.tensorrt`, which also checks the ONNX model first.

Written against the TensorRT 10.x and 11.x Python API: the network is strongly typed (the only mode in
11.x), so precision comes from the ONNX graph itself (fp16 weights and activations, LayerNormalization
accumulating in fp32, pooling and the output in fp32) and no weak-typing builder flags are used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def gpu_identity(index: int = 0) -> dict:
    """Name and compute capability of a GPU, from nvidia-smi (present wherever a GPU is exposed)."""
    query = ["nvidia-smi", f"--id={index}", "--query-gpu=name,compute_cap", "--format=csv,noheader"]
    name, capability = (part.strip() for part in subprocess.check_output(query, text=True).split(","))
    return {"gpu_name": name, "compute_capability": capability}


def plan_problems(sidecar: dict, gpu: dict, tensorrt_version: str) -> list[str]:
    """Why a plan described by its sidecar must not be served on this GPU and TensorRT; empty if it may.

    A plan only deserializes on the TensorRT version and GPU architecture it was built for; on another
    GPU product of the same architecture it loads but runs kernels tuned for the wrong chip.
    """
    problems = []
    if sidecar["tensorrt_version"].split(".")[:3] != tensorrt_version.split(".")[:3]:
        problems.append(f"built with TensorRT {sidecar['tensorrt_version']}, this server has {tensorrt_version}")
    if sidecar["compute_capability"] != gpu["compute_capability"]:
        problems.append(
            f"built for compute capability {sidecar['compute_capability']} ({sidecar['gpu_name']}), "
            f"this GPU is {gpu['compute_capability']} ({gpu['gpu_name']})"
        )
    elif sidecar["gpu_name"] != gpu["gpu_name"]:
        problems.append(f"tuned on {sidecar['gpu_name']}, this GPU is {gpu['gpu_name']}: rebuild it here")
    return problems


def build(spec: dict) -> dict:
    import tensorrt as trt

    sidecar_path = Path(spec["plan"] + ".json")
    if Path(spec["plan"]).is_file() and sidecar_path.is_file():
        existing = json.loads(sidecar_path.read_text())
        if existing.get("build_key") == spec["build_key"] and not plan_problems(
            existing, gpu_identity(), trt.__version__
        ):
            print(f"{spec['plan']} is up to date (same ONNX, profiles, precision, TensorRT and GPU)")
            return existing

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    strongly_typed = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(strongly_typed)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(spec["onnx"]):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected {spec['onnx']}:\n{errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec["workspace_mib"] << 20)
    config.builder_optimization_level = spec["optimization_level"]
    config.progress_monitor = _progress_monitor()
    for profile_spec in spec["profiles"]:
        profile = builder.create_optimization_profile()
        for name in spec["inputs"]:
            low, opt, high = (tuple(profile_spec[key]) for key in ("min", "opt", "max"))
            profile.set_shape(name, low, opt, high)  # type: ignore[arg-type]  # the bindings take tuples as Dims
        config.add_optimization_profile(profile)

    cache_path = Path(spec["timing_cache"])
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)

    started = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT failed to build the plan (see the builder log above)")
    Path(spec["plan"]).write_bytes(bytes(plan))
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    sidecar = {
        "tensorrt_version": trt.__version__,
        **gpu_identity(),
        "precision": spec["precision"],
        "profiles": spec["profiles"],
        "onnx_sha256": spec["onnx_sha256"],
        "build_key": spec["build_key"],
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    sidecar_path.write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def _progress_monitor():
    import tensorrt as trt

    class Progress(trt.IProgressMonitor):
        """Prints each builder phase with its step count, so a long build visibly moves."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps):
            print(f"[tensorrt] {phase_name}: {num_steps} steps", flush=True)

        def step_complete(self, phase_name, step):
            return True  # never cancel

        def phase_finish(self, phase_name):
            print(f"[tensorrt] {phase_name}: done", flush=True)

    return Progress()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m export.tensorrt_build SPEC.json", file=sys.stderr)
        return 2
    sidecar = build(json.loads(Path(args[0]).read_text()))
    print(json.dumps(sidecar, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
