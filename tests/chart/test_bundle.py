"""The chart's model bundle and the TensorRT engine cache (docker/engine_cache.py), with a stand-in builder."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from export import sha256
from serving.launcher.triton_install import check_tensorrt_plans
from settings import ROOT
from tests.support import (
    DOCKER,
    load_module,
)

engine_cache = load_module("engine_cache", DOCKER / "engine_cache.py")


bundle = load_module("bundle", ROOT / "helm" / "bundle.py")


# ---------------------------------------------------------------------------------------------------------
# Bundle and engine cache (the chart's TensorRT engine build), with a stand-in for the TensorRT builder
# ---------------------------------------------------------------------------------------------------------
H200 = {"gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


class FakeBuilder:
    """Writes what export.tensorrt_build.build writes (a plan and its sidecar) for a given GPU."""

    def __init__(self, gpu: dict, version: str = "10.5.0.18") -> None:
        self.gpu, self.version, self.specs = gpu, version, []

    def __call__(self, spec: dict) -> dict:
        self.specs.append(spec)
        assert Path(spec["onnx"]).is_file()
        Path(spec["plan"]).write_bytes(b"plan for " + self.gpu["gpu_name"].encode())
        Path(spec["timing_cache"]).write_bytes(b"timings")
        sidecar = {"tensorrt_version": self.version, **self.gpu}
        sidecar.update({key: spec[key] for key in ("precision", "profiles", "onnx_sha256", "build_key")})
        Path(spec["plan"] + ".json").write_text(json.dumps(sidecar))
        return sidecar


@pytest.fixture()
def tensorrt_bundle(settings, exported, tmp_path):
    """A bundle for engine.kind tensorrt: the repository without a plan, engine/ with a spec and an ONNX model."""
    trt_settings = dataclasses.replace(
        settings,
        engine=dataclasses.replace(settings.engine, kind="tensorrt", precision="fp16"),
        encoder=dataclasses.replace(settings.encoder, gpus=(0,)),
    )
    root = tmp_path / "bundle"
    repository = bundle.write_repository(trt_settings, exported, root / "repository")
    engine = root / "engine"
    engine.mkdir()
    onnx = engine / "model.fp16.onnx"
    shutil.copyfile(exported / "model.onnx", onnx)
    spec = {"onnx": "build/models/x/model.fp16.onnx", "onnx_sha256": sha256(onnx), "plan": "build/models/x/model.plan",
            "inputs": ["input_ids", "attention_mask"], "precision": "fp16", "profiles": [], "workspace_mib": 1024,
            "optimization_level": 3, "timing_cache": "build/tensorrt_timing.cache", "build_key": "abc123"}  # fmt: skip
    (engine / engine_cache.SPEC_FILE).write_text(json.dumps(spec))
    return root, repository, spec


def test_bundle_for_tensorrt_leaves_the_plan_to_the_engine_build(tensorrt_bundle):
    _, repository, _ = tensorrt_bundle
    config = (repository / "encoder" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in config
    assert not list((repository / "encoder" / "1").iterdir()), "no plan (nor a placeholder) in the bundle"
    assert {p.name for p in repository.iterdir()} == {"tokenizer", "encoder", "ensemble"}


def test_bundle_for_other_engines_is_the_generated_repository(settings, exported, tmp_path):
    repository = bundle.write_repository(settings, exported, tmp_path / "repository")
    assert (repository / "ensemble" / "1" / "model.onnx").is_file()
    assert (repository / "ensemble" / "config.pbtxt").is_file()


def test_engine_cache_builds_once_per_gpu_product(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    cache = tmp_path / "cache"
    builder = FakeBuilder(H200)
    folder = engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert folder == cache / "NVIDIA-H200" / "tensorrt-10.5.0.18" / "abc123"
    assert (folder / "model.plan").read_bytes() == b"plan for NVIDIA H200"
    assert (folder.parent / "timing.cache").is_file()
    assert sorted(p.name for p in folder.parent.iterdir()) == [".lock", "abc123", "timing.cache"]  # no scratch left
    assert len(builder.specs) == 1 and builder.specs[0]["onnx"] == str(root / "engine" / "model.fp16.onnx")

    # Cached: a second pod of the same product builds nothing.
    again = engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert again == folder and len(builder.specs) == 1

    # Another product gets its own plan; a plan tuned on another GPU in this folder is rebuilt.
    h100 = FakeBuilder(H100)
    other = engine_cache.ensure_plan(spec, root / "engine", cache, H100["gpu_name"], H100, "10.5.0.18", h100)
    assert other.parent.parent.name == "NVIDIA-H100-80GB-HBM3" and len(h100.specs) == 1
    shutil.copyfile(other / "model.plan.json", folder / "model.plan.json")
    engine_cache.ensure_plan(spec, root / "engine", cache, "NVIDIA-H200", H200, "10.5.0.18", builder)
    assert len(builder.specs) == 2

    # Another TensorRT version: another folder.
    newer = engine_cache.ensure_plan(
        spec, root / "engine", cache, "NVIDIA-H200", H200, "10.6.0", FakeBuilder(H200, "10.6.0")
    )
    assert newer.parent.name == "tensorrt-10.6.0"


def test_engine_cache_refuses_an_onnx_model_the_spec_was_not_written_for(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    with pytest.raises(engine_cache.EngineCacheError, match="not the ONNX model"):
        engine_cache.ensure_plan(
            {**spec, "onnx_sha256": "0" * 64}, root / "engine", tmp_path, "X", H200, "10.5.0", FakeBuilder(H200)
        )


def test_assembled_repository_passes_the_launchers_plan_check(tensorrt_bundle, tmp_path):
    root, _, spec = tensorrt_bundle
    folder = engine_cache.ensure_plan(
        spec, root / "engine", tmp_path / "cache", "NVIDIA-H200", H200, "10.5.0.18", FakeBuilder(H200)
    )
    out = engine_cache.assemble(root / "repository", folder, tmp_path / "models" / "repository")
    assert (out / "encoder" / "1" / "model.plan").read_bytes() == b"plan for NVIDIA H200"
    check_tensorrt_plans(out, gpu_identity=lambda index: H200, tensorrt_version="10.5.0")
    with pytest.raises(Exception, match="tuned on NVIDIA H200"):
        check_tensorrt_plans(out, gpu_identity=lambda index: H100, tensorrt_version="10.5.0")
    # Assembling again (an init container restarted in the same pod) overwrites in place.
    engine_cache.assemble(root / "repository", folder, out)
    with pytest.raises(engine_cache.EngineCacheError, match="no tensorrt_plan encoder"):
        engine_cache.assemble(out / "tokenizer", folder, tmp_path / "elsewhere")


def test_product_labels_look_like_gpu_feature_discovery():
    assert engine_cache.product_label("NVIDIA H200") == "NVIDIA-H200"
    assert engine_cache.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert engine_cache.product_label("NVIDIA-H200") == "NVIDIA-H200"
    assert engine_cache.product_label(" Tesla T4/x ") == "Tesla-T4-x"
    with pytest.raises(engine_cache.EngineCacheError):
        engine_cache.product_label(" // ")
