"""engine.kind / engine.precision "auto" (common/engine_choice.py): what each machine and task gets, and what is
refused."""

from __future__ import annotations

import pytest

from common.engine_choice import choose_engine, cpu_flags
from settings import ROOT, SettingsError, load_settings

AMX = frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


@pytest.mark.parametrize(
    ("kind", "precision", "flags", "has_torch", "expected"),
    [
        ("auto", "auto", AMX, True, ("torch", "bf16")),
        ("auto", "auto", ZEN4, True, ("torch", "bf16")),
        ("auto", "auto", ZEN4, False, ("onnxruntime_cpu", "fp32")),  # the CPU image without torch
        ("auto", "auto", AVX2, True, ("onnxruntime_cpu", "fp32")),
        ("auto", "fp32", AMX, True, ("onnxruntime_cpu", "fp32")),  # fp32: the faster fp32 engine
        ("auto", "bf16", AVX2, True, ("torch", "bf16")),  # as set, even where it is slow
        ("torch", "auto", AVX2, True, ("torch", "fp32")),
        ("torch", "auto", AMX, True, ("torch", "bf16")),
        ("onnxruntime_cpu", "auto", AMX, True, ("onnxruntime_cpu", "fp32")),
        ("torch", "fp32", AMX, True, ("torch", "fp32")),
    ],
)
def test_a_cpu_gets_the_engine_its_instructions_make_fastest(kind, precision, flags, has_torch, expected):
    choice = choose_engine(kind, precision, False, "embedding", flags=flags, has_torch=has_torch)
    assert (choice.kind, choice.precision) == expected
    assert choice.reason and choice.kind in choice.describe()


@pytest.mark.parametrize("task", ["embedding", "classification", "rerank", "multi_vector", "hybrid"])
def test_the_other_tasks_get_bf16_where_the_cpu_has_it(task):
    """Their bar, cosine >= 0.9999 to fp32, holds at bf16 (tests/server/test_engine_choice_served.py)."""
    assert choose_engine("auto", "auto", False, task, flags=ZEN4, has_torch=True).precision == "bf16"


@pytest.mark.parametrize(
    ("kind", "precision", "flags", "has_torch", "expected"),
    [
        ("auto", "auto", AMX, True, ("onnxruntime_cpu", "fp32")),
        ("auto", "auto", ZEN4, True, ("onnxruntime_cpu", "fp32")),
        ("auto", "auto", AVX2, True, ("onnxruntime_cpu", "fp32")),
        ("auto", "auto", ZEN4, False, ("onnxruntime_cpu", "fp32")),
        ("torch", "auto", ZEN4, True, ("torch", "fp32")),
        ("onnxruntime_cpu", "auto", ZEN4, True, ("onnxruntime_cpu", "fp32")),
        ("auto", "bf16", ZEN4, True, ("torch", "bf16")),  # as set: the terms move, the user asked for it
    ],
)
def test_a_sparse_model_runs_fp32_on_any_cpu(kind, precision, flags, has_torch, expected):
    """Task sparse's bar (its terms above 1 % of the max, set and order, the reference's) holds at fp32 only, and
    onnxruntime_cpu is its faster fp32 engine too (docs/results/cpu-2026-12-04/sparse-precision)."""
    choice = choose_engine(kind, precision, False, "sparse", flags=flags, has_torch=has_torch)
    assert (choice.kind, choice.precision) == expected
    assert choice.reason


def test_a_gpu_gets_torch_at_fp16_unless_set():
    assert choose_engine("auto", "auto", True, "embedding").kind == "torch"
    assert choose_engine("auto", "auto", True, "embedding").precision == "fp16"
    assert choose_engine("torch", "bf16", True, "embedding").precision == "bf16"


def test_a_sparse_model_on_a_gpu_gets_torch_at_fp32_unless_set():
    """fp16 logits alone leave pairs of terms unordered that the reference orders (bench/sparse_bench.py's
    rounding_floors)."""
    choice = choose_engine("auto", "auto", True, "sparse")
    assert (choice.kind, choice.precision) == ("torch", "fp32")
    assert choose_engine("auto", "fp16", True, "sparse").precision == "fp16"


def test_bf16_on_a_cpu_without_torch_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs torch"):
        choose_engine("auto", "bf16", False, "embedding", flags=AMX, has_torch=False)


def test_the_settings_choose_for_their_model_s_task():
    """settings.engine_choice(), which the API front's /info says, passes the model's task."""
    sparse = load_settings(ROOT / "settings" / "variants" / "splade.toml")
    assert sparse.engine_choice() == choose_engine("auto", "auto", False, "sparse")
    assert load_settings().engine_choice() == choose_engine("auto", "auto", False, "embedding")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['engine.kind="onnxruntime_cpu"', 'engine.precision="bf16"'], "onnxruntime_cpu runs fp32 only"),
        (['engine.kind="tensorrt"', 'ensemble.topology="two_stage"', "encoder.gpus=[0]"], "set engine.precision"),
        (['engine.precision="fp16"'], "runs on the CPU"),
    ],
)
def test_precisions_an_engine_cannot_run_are_refused(overrides, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(None, overrides)
