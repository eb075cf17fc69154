"""`make engines`: everything up to the TensorRT builder runs here on the exported model; the build itself where
TensorRT is."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from export.tensorrt import EngineBuildError, check_onnx, prepare, read_versions
from model_repository.generate import generate
from serving.launcher.triton_install import check_tensorrt_plans
from serving.processes import ServerError
from settings import ROOT
from settings.tensorrt_profiles import graph_batches, profiles
from tests.support import H200_IDENTITY, HAVE_GPU, HAVE_TENSORRT, needs_tensorrt


def test_profiles_cover_every_length_and_batch(trt_settings):
    plan_profiles = profiles(trt_settings)
    buckets = trt_settings.tensorrt.sequence_buckets
    assert len(plan_profiles) == len(buckets)
    previous_max = 0
    for profile, bucket in zip(plan_profiles, buckets, strict=True):
        assert profile["min"] == [1, previous_max + 1]
        assert profile["max"] == [trt_settings.encoder.max_batch_size, bucket]
        assert profile["opt"][1] == bucket
        assert profile["opt"][0] == min(trt_settings.encoder.max_batch_size, 16384 // bucket)
        previous_max = bucket
    assert previous_max == trt_settings.model.max_tokens
    assert graph_batches(trt_settings, 128) == [1, 2, 4, 8, 16, 32, 64]


def test_fp16_onnx_is_validated_and_fit_for_tensorrt(trt_settings):
    spec_path, report = prepare(trt_settings)
    assert report["min_cosine"] >= 0.999
    spec = json.loads(spec_path.read_text())
    assert spec["precision"] == "fp16" and spec["inputs"] == ["input_ids", "attention_mask"]
    assert spec["profiles"] == profiles(trt_settings) and len(spec["build_key"]) == 16
    graph = onnx.load(spec["onnx"], load_external_data=False).graph
    assert graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT, "pooled output stays fp32"
    initializer_types = {init.data_type for init in graph.initializer if init.dims}
    assert TensorProto.FLOAT16 in initializer_types, "weights are fp16"


def test_default_onnx_export_passes_the_checks(exported):
    assert check_onnx(exported / "model.onnx") == []


@pytest.fixture
def trt_repository(trt_settings, tmp_path):
    """A generated tensorrt repository. The plan file here is a placeholder, never served: these tests read
    configs and the build record only."""
    export_dir = tmp_path / "export"
    shutil.copytree(trt_settings.export_dir, export_dir, ignore=shutil.ignore_patterns("*.onnx"))
    (export_dir / "model.plan").write_bytes(b"placeholder for config tests, not a TensorRT plan")
    sidecar = {"tensorrt_version": "10.5.0.18", **H200_IDENTITY, "profiles": profiles(trt_settings)}
    (export_dir / "model.plan.json").write_text(json.dumps(sidecar))
    return generate(trt_settings, export_dir, tmp_path / "repo")


def test_tensorrt_encoder_config(trt_settings, trt_repository):
    config = text_format.Parse((trt_repository / "encoder" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.platform == "tensorrt_plan" and config.default_model_filename == "model.plan"
    assert not any(i.allow_ragged_batch for i in config.input)
    assert all(i.data_type == mc.TYPE_INT32 for i in config.input)
    assert list(config.dynamic_batching.preferred_batch_size) == sorted({p["opt"][0] for p in profiles(trt_settings)})
    (group,) = config.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0] and group.count == 2
    assert list(group.profile) == [str(i) for i in range(len(trt_settings.tensorrt.sequence_buckets))]
    assert config.optimization.cuda.graphs
    specs = config.optimization.cuda.graph_spec
    assert len(specs) == len(trt_settings.tensorrt.sequence_buckets) * len(graph_batches(trt_settings, 16))
    for spec in specs:
        length = list(spec.input["input_ids"].dim)
        assert length[0] in trt_settings.tensorrt.sequence_buckets
        assert list(spec.graph_lower_bound.input["attention_mask"].dim) == length
        assert spec.graph_lower_bound.batch_size == spec.batch_size // 2 + 1
    tokenizer = text_format.Parse((trt_repository / "tokenizer" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert tokenizer.parameters["pad_to_buckets"].string_value == "16,32,64,128,256"
    assert (trt_repository / "encoder" / "1" / "model.plan.json").is_file()


def test_server_refuses_a_plan_for_another_gpu_or_tensorrt(trt_repository):
    check_tensorrt_plans(trt_repository, lambda gpu: H200_IDENTITY, "10.5.0.18")  # matching: accepted
    with pytest.raises(ServerError, match=r"refusing encoder's plan on GPU 0: .*this GPU is 8\.9 \(NVIDIA L4\)"):
        check_tensorrt_plans(
            trt_repository, lambda gpu: {"gpu_name": "NVIDIA L4", "compute_capability": "8.9"}, "10.5.0"
        )
    with pytest.raises(ServerError, match=r"built with TensorRT 10\.5\.0\.18, this server has 10\.8\.0"):
        check_tensorrt_plans(trt_repository, lambda gpu: H200_IDENTITY, "10.8.0")


@pytest.mark.skipif(HAVE_TENSORRT and HAVE_GPU, reason="TensorRT and a GPU are here: the real build runs instead")
def test_make_engines_without_tensorrt_says_what_to_run(trt_settings, tmp_path):
    settings_file = tmp_path / "settings.toml"
    text = trt_settings.path.read_text().replace('kind = "auto"', 'kind = "tensorrt"')
    text = text.replace('precision = "auto"', 'precision = "fp16"').replace("gpus = []", "gpus = [0]")
    text = text.replace("max_tokens = 0 ", "max_tokens = 256 ")  # a plan's profiles need it set
    settings_file.write_text(text.replace('build_dir = "build"', f'build_dir = "{trt_settings.server.build_dir}"'))
    run = subprocess.run([sys.executable, "-m", "export.tensorrt", "--settings", str(settings_file)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert run.returncode == 1
    assert read_versions()["TENSORRT_IMAGE"] in run.stderr and "export.tensorrt_build" in run.stderr
    assert not (trt_settings.export_dir / "model.plan").exists(), "no plan is written when none was built"


def test_quantized_precisions_need_a_qdq_model(trt_settings):
    int8 = dataclasses.replace(trt_settings, engine=dataclasses.replace(trt_settings.engine, precision="int8"))
    with pytest.raises(EngineBuildError, match="Q/DQ"):
        prepare(int8)


@needs_tensorrt
def test_plan_builds_and_matches_onnxruntime(trt_settings, golden_sequences):
    """On a GPU with TensorRT: build the fp16 plan, run it with TensorRT's runtime, compare with ONNX Runtime."""
    import tensorrt as trt
    import torch

    from export.tensorrt_build import build
    from model_repository.stages.engines import load_engine

    spec_path, _ = prepare(trt_settings)
    spec = json.loads(spec_path.read_text())
    build(spec)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(Path(spec["plan"]).read_bytes())
    context = engine.create_execution_context()
    from common.padding import pad_sequences

    ids, mask = pad_sequences(golden_sequences, 0)
    inputs = {"input_ids": torch.from_numpy(ids).cuda(), "attention_mask": torch.from_numpy(mask).cuda()}
    profile = next(i for i, b in enumerate(trt_settings.tensorrt.sequence_buckets) if b >= ids.shape[1])
    stream = torch.cuda.current_stream()
    context.set_optimization_profile_async(profile, stream.cuda_stream)
    for name, tensor in inputs.items():
        context.set_input_shape(name, tuple(tensor.shape))
        context.set_tensor_address(name, tensor.data_ptr())
    out = torch.empty((len(ids), 384), dtype=torch.float32, device="cuda")
    context.set_tensor_address("embedding", out.data_ptr())
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    reference = load_engine("onnxruntime_cpu", trt_settings.export_dir).forward(golden_sequences)
    served = out.cpu().numpy()
    cosine = (served * reference).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.999
