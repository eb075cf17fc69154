"""TensorRT's checks that need no model: ONNX graphs refused with the reason, plan compatibility, bucket padding."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from export.tensorrt import check_onnx
from export.tensorrt_build import plan_problems
from tests.support import H200_IDENTITY


def _graph(input_type=TensorProto.INT32, ops=("MatMul", "Softmax", "MatMul"), opset=17):
    inputs = [
        helper.make_tensor_value_info(n, input_type, ["batch", "sequence"]) for n in ("input_ids", "attention_mask")
    ]
    nodes, last = [], "input_ids"
    for index, op in enumerate(ops):
        nodes.append(helper.make_node(op, [last, last] if op == "MatMul" else [last], [f"t{index}"], name=f"n{index}"))
        last = f"t{index}"
    output = helper.make_tensor_value_info(last, TensorProto.FLOAT, None)
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, [output]), opset_imports=[helper.make_opsetid("", opset)]
    )


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        (_graph(input_type=TensorProto.INT64), "INT64, not INT32"),
        (_graph(opset=11), "opset 11"),
        (_graph(ops=("MatMul", "Softmax", "MatMul", "NonZero")), "NonZero"),
        (_graph(ops=("Relu", "Softmax", "MatMul")), "MatMul-Softmax-MatMul"),
        (_graph(ops=("MatMul", "Relu")), "no Softmax"),
    ],
)
def test_onnx_checks_name_the_problem(tmp_path, model, problem):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    assert any(problem in p for p in check_onnx(path)), check_onnx(path)
    assert check_onnx(path) != []


def test_plan_compatibility():
    sidecar = {"tensorrt_version": "10.5.0.18", **H200_IDENTITY}
    assert plan_problems(sidecar, H200_IDENTITY, "10.5.0.18") == []
    assert plan_problems(sidecar, H200_IDENTITY, "10.5.0") == [], "the build number does not matter"
    assert "TensorRT 10.5.0.18" in plan_problems(sidecar, H200_IDENTITY, "10.13.3")[0]
    h100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert "tuned on NVIDIA H200" in plan_problems(sidecar, h100, "10.5.0")[0]
    l4 = {"gpu_name": "NVIDIA L4", "compute_capability": "8.9"}
    assert "compute capability 9.0" in plan_problems(sidecar, l4, "10.5.0")[0]


def test_bucket_padding_in_the_tokenizer_stage():
    from common.padding import pad_sequences

    ids, mask = pad_sequences([[101, 7, 102], [101, 102]], 0, (4, 8))
    assert ids.shape == (2, 4) and mask.sum() == 5
    assert pad_sequences([[1] * 9], 0, (4, 8))[0].shape == (1, 9), "longer than every bucket: its own length"
