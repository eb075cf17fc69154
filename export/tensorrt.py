"""python -m export.tensorrt (`make engines`): ONNX -> TensorRT plan for the `tensorrt` engine kind.

Here, with the project's environment: export the ONNX model at the engine precision (validated against
PyTorch on ONNX Runtime where it can run), check it is TensorRT-friendly, derive optimization profiles from
the settings and write a build spec. Then the build itself (export/tensorrt_build.py) runs where TensorRT
is: in this environment if `tensorrt` imports and a GPU is visible, else in the pinned NGC TensorRT
container when Docker can run it, else this command stops and says what to run where. It never writes a
plan it did not build.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from common.contract import ENGINE_INPUTS, TOKEN_TYPES, ServingSpec
from export import sha256
from settings import ROOT, Settings, SettingsError, load_settings
from settings.schema import QUANTIZED
from settings.tensorrt_profiles import profiles

VERSIONS_FILE = ROOT / "docker" / "versions.env"
# The ONNX opsets TensorRT 10's parser accepts for every op below.
OPSETS = range(13, 21)
# Ops an export of the encoder families may contain, each listed as supported in the TensorRT 10 ONNX parser's
# operator matrix (onnx-tensorrt docs/operators.md, 10.0 and 10.1): BERT's; RoBERTa's family's (GatherElements;
# its positions come from the mask, export/onnx_export.py, not transformers' int32 CumSum, which the matrix lists
# for floats only); MPNet's relative position buckets (Abs, Log, Min); ModernBERT's rotary embeddings and sliding
# window (Sin, Cos, Abs, LessOrEqual); DistilBERT's head (Relu). Conservative on purpose: anything else is
# reported, not assumed to work.
TENSORRT_OPS = frozenset(
    "Abs Add And Cast Clip Concat Constant ConstantOfShape Cos DequantizeLinear Div Equal Erf Exp Expand "
    "Flatten Gather GatherElements Gelu Gemm Greater GreaterOrEqual Identity LayerNormalization Less LessOrEqual Log "
    "MatMul Max Min Mul Neg Not Or Pow QuantizeLinear Range ReduceL2 ReduceMax ReduceMean ReduceSum Reshape Shape "
    "Relu Sigmoid Sin Slice Softmax Split Sqrt Squeeze Sub Tanh Tile Transpose Unsqueeze Where".split()
)
# Between the scores MatMul and Softmax (scale, mask) and between Softmax and the context MatMul (casts):
# what TensorRT's multi-head-attention fusion matches through.
ATTENTION_GLUE = frozenset({"Add", "Div", "Mul", "Cast", "Where", "Sub"})


class EngineBuildError(RuntimeError):
    """The plan cannot be built here, or the model is not fit for TensorRT."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def check_onnx(path: Path, inputs: tuple[str, ...] = ENGINE_INPUTS) -> list[str]:
    """Reasons the ONNX model would not parse, fuse or batch well in TensorRT; empty when it is fit. `inputs`: what
    the serving spec says the engine takes (ServingSpec.engine_inputs: a BERT reranker's token types too)."""
    model = onnx.load(str(path), load_external_data=False)
    problems = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset not in OPSETS:
        problems.append(f"opset {opset} is outside {OPSETS.start}-{OPSETS.stop - 1}")
    graph = model.graph
    graph_inputs = {tensor.name: tensor for tensor in graph.input}
    for name in inputs:
        if name not in graph_inputs:
            problems.append(f"input {name} is missing")
            continue
        tensor_type = graph_inputs[name].type.tensor_type
        if tensor_type.elem_type != onnx.TensorProto.INT32:
            problems.append(f"input {name} is {onnx.TensorProto.DataType.Name(tensor_type.elem_type)}, not INT32")
        if [d.dim_param for d in tensor_type.shape.dim] != ["batch", "sequence"]:
            problems.append(f"input {name} needs dynamic [batch, sequence] axes")
    extra = sorted(set(graph_inputs) - set(inputs))
    if extra:
        problems.append(f"inputs the serving spec does not send: {', '.join(extra)}")
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx")})
    if foreign:
        problems.append(f"custom-domain ops TensorRT's parser lacks: {', '.join(foreign)}")
    unsupported = sorted({n.op_type for n in graph.node if n.domain in ("", "ai.onnx")} - TENSORRT_OPS)
    if unsupported:
        problems.append(f"ops outside TensorRT's documented ONNX support: {', '.join(unsupported)}")
    problems += _attention_problems(graph)
    return problems


def _attention_problems(graph: onnx.GraphProto) -> list[str]:
    """Every Softmax must sit between two MatMuls, joined only by scale/mask/cast ops, to fuse as MHA."""
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def reaches_matmul_upstream(node: onnx.NodeProto, depth: int = 4) -> bool:
        for name in node.input:
            source = producer.get(name)
            if source is None:
                continue
            if source.op_type == "MatMul" or (
                source.op_type in ATTENTION_GLUE and depth and reaches_matmul_upstream(source, depth - 1)
            ):
                return True
        return False

    def reaches_matmul_downstream(node: onnx.NodeProto, depth: int = 3) -> bool:
        for consumer in consumers.get(node.output[0], []):
            if consumer.op_type == "MatMul" or (
                consumer.op_type == "Cast" and depth and reaches_matmul_downstream(consumer, depth - 1)
            ):
                return True
        return False

    softmaxes = [node for node in graph.node if node.op_type == "Softmax"]
    if not softmaxes:
        return ["no Softmax found: not a BERT attention graph"]
    broken = [n.name for n in softmaxes if not (reaches_matmul_upstream(n) and reaches_matmul_downstream(n))]
    return [f"attention not in MatMul-Softmax-MatMul form at {', '.join(broken)}"] if broken else []


def precision_onnx(settings: Settings, export_dir: Path, quantized_onnx: Path | None) -> tuple[Path, dict]:
    """The ONNX model TensorRT builds from, typed at the engine precision, and what validated it."""
    precision = settings.engine.precision
    if precision == "fp32":
        return export_dir / "model.onnx", {"validated": "by python -m export (fp32)"}
    if precision in QUANTIZED:
        if quantized_onnx is None:
            raise EngineBuildError(
                f"precision {precision} builds from an ONNX model with Q/DQ nodes (calibrate it with NVIDIA "
                "Model Optimizer), passed with --onnx; this project does not calibrate"
            )
        ops = {node.op_type for node in onnx.load(str(quantized_onnx), load_external_data=False).graph.node}
        if not {"QuantizeLinear", "DequantizeLinear"} <= ops:
            raise EngineBuildError(f"{quantized_onnx} has no QuantizeLinear/DequantizeLinear nodes")
        return quantized_onnx, {"validated": "not here: quantized models are checked after the build"}
    return export_reduced_precision(settings, export_dir, precision)


def export_reduced_precision(settings: Settings, export_dir: Path, precision: str) -> tuple[Path, dict]:
    """fp16/bf16 ONNX from the exported weights: encoder in reduced precision, pooling and output in fp32."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    from common.hf_tokenizer import load_tokenizer
    from common.padding import pad_sequences
    from export.checkpoint import Pooling
    from export.onnx_export import VALIDATION_SENTENCES, ServingModule, export_onnx

    spec = ServingSpec.load(export_dir)
    auto = AutoModel if spec.task == "embedding" else AutoModelForSequenceClassification
    model = auto.from_pretrained(export_dir, attn_implementation="eager").eval()
    module = ServingModule(model, spec.task, Pooling(spec.pooling, spec.normalize), spec.token_types)
    tokenizer = load_tokenizer(export_dir / "tokenizer.json", spec.max_tokens)
    sentences = VALIDATION_SENTENCES.read_text().splitlines()
    inputs = list(zip(sentences, sentences[1:] + sentences[:1], strict=True)) if spec.pairs else sentences
    encodings = tokenizer.encode_batch(inputs)
    ids, mask = pad_sequences([e.ids for e in encodings], spec.pad_token_id)
    feeds = {"input_ids": ids, "attention_mask": mask}
    if TOKEN_TYPES in spec.engine_inputs:
        feeds[TOKEN_TYPES] = pad_sequences([e.type_ids for e in encodings], 0)[0]
    with torch.no_grad():
        reference = module(*(torch.from_numpy(feeds[name]) for name in spec.engine_inputs)).numpy()
    path = export_dir / f"model.{precision}.onnx"
    module.to(torch.float16 if precision == "fp16" else torch.bfloat16)
    export_onnx(module, path, spec, settings.engine.onnx_opset)
    if precision == "bf16":  # ONNX Runtime's CPU provider has no bf16 MatMul: the build's own check stands
        return path, {"validated": "not here: ONNX Runtime CPU cannot run bf16"}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (served,) = session.run(None, feeds)
    if spec.pairs:  # one logit per pair: held to an absolute bound rather than a cosine
        drift = float(np.abs(served - reference).max())
        if drift > 0.05:
            raise EngineBuildError(f"the {precision} ONNX model drifts from fp32 PyTorch: max abs {drift:.4f}")
        return path, {"validated": f"ONNX Runtime CPU vs fp32 PyTorch on {len(inputs)} pairs", "max_abs": drift}
    cosine = (served * reference).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))
    if cosine.min() < 0.999:
        raise EngineBuildError(f"the {precision} ONNX model drifts from fp32 PyTorch: min cosine {cosine.min():.5f}")
    return path, {"validated": f"ONNX Runtime CPU vs fp32 PyTorch on {len(sentences)} sentences",
                  "min_cosine": float(cosine.min())}  # fmt: skip


def portable(path: Path) -> str:
    """Paths in the spec are relative to the repository root, so the builder container (which mounts the
    repository at its working directory) finds the same files."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def build_spec(settings: Settings, onnx_path: Path, plan: Path) -> dict:
    ts = settings.tensorrt
    spec = {
        "onnx": portable(onnx_path),
        "onnx_sha256": sha256(onnx_path),
        "plan": portable(plan),
        "inputs": list(ServingSpec.load(settings.export_dir).engine_inputs),
        "precision": settings.engine.precision,
        "profiles": profiles(settings),
        "workspace_mib": ts.workspace_mib,
        "optimization_level": ts.optimization_level,
        "timing_cache": portable(settings.build_dir / "tensorrt_timing.cache"),
    }
    key_fields = {k: spec[k] for k in ("onnx_sha256", "precision", "profiles", "workspace_mib", "optimization_level")}
    spec["build_key"] = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:16]
    return spec


def gpu_visible() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def docker_usable() -> bool:
    return (
        shutil.which("docker") is not None and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


def run_build(spec_path: Path) -> list[str]:
    """The command that builds the plan here or in the NGC container; EngineBuildError when neither can."""
    relative = portable(spec_path)
    if importlib.util.find_spec("tensorrt") is not None and gpu_visible():
        return [sys.executable, "-m", "export.tensorrt_build", relative]
    image = read_versions()["TENSORRT_IMAGE"]
    if docker_usable() and gpu_visible():
        if Path(relative).is_absolute():
            raise EngineBuildError(f"{spec_path} lies outside the repository, which is all the container mounts")
        return ["docker", "run", "--rm", "--gpus", "all", "--user", f"{os.getuid()}:{os.getgid()}",
                "-v", f"{ROOT}:/workspace", "-w", "/workspace", image,
                "python3", "-m", "export.tensorrt_build", relative]  # fmt: skip
    raise EngineBuildError(
        "cannot build a TensorRT plan here: "
        + ("`import tensorrt` fails" if importlib.util.find_spec("tensorrt") is None else "no GPU is visible")
        + " and Docker cannot run the builder container. The build spec is ready: on a machine with an NVIDIA "
        f"GPU of the serving type and Docker, run from the repository root\n  docker run --rm --gpus all "
        f"-v $PWD:/workspace -w /workspace {image} python3 -m export.tensorrt_build {relative}\n"
        "or, where TensorRT's Python bindings are installed, python3 -m export.tensorrt_build " + str(relative)
    )


def prepare(settings: Settings, quantized_onnx: Path | None = None) -> tuple[Path, dict]:
    """Everything up to the builder: typed ONNX, checks, profiles; returns (spec path, report)."""
    if settings.engine.kind != "tensorrt":
        raise SettingsError(f'engine.kind is {settings.engine.kind!r}: set it to "tensorrt" to build plans')
    export_dir = settings.export_dir
    if not (export_dir / "serving.json").is_file():
        raise SettingsError(f"{export_dir} holds no exported model: run `make export` first")
    onnx_path, validation = precision_onnx(settings, export_dir, quantized_onnx)
    problems = check_onnx(onnx_path, ServingSpec.load(export_dir).engine_inputs)
    if problems:
        raise EngineBuildError(f"{onnx_path} is not fit for TensorRT:\n- " + "\n- ".join(problems))
    spec = build_spec(settings, onnx_path, export_dir / "model.plan")
    spec_path = export_dir / "tensorrt_build.json"
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    return spec_path, {"onnx": str(onnx_path), **validation, "profiles": len(spec["profiles"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.tensorrt", description=__doc__)
    parser.add_argument("--settings", help="settings file (engine.kind must be tensorrt)")
    parser.add_argument("--onnx", type=Path, help="a Q/DQ-quantized ONNX model, for precision int8 or fp8")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.settings)
        spec_path, report = prepare(settings, args.onnx)
        print(json.dumps(report, indent=2), flush=True)
        command = run_build(spec_path)
    except (SettingsError, EngineBuildError) as exc:
        print(f"make engines: {exc}", file=sys.stderr)
        return 1
    print("building:", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
