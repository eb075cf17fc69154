"""engine.kind / engine.precision "auto" (common/engine_choice.py): what each machine gets, and what is refused."""

from __future__ import annotations

import pytest

from common.engine_choice import choose_engine, cpu_flags
from settings import SettingsError, load_settings

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
    choice = choose_engine(kind, precision, on_gpu=False, flags=flags, has_torch=has_torch)
    assert (choice.kind, choice.precision) == expected
    assert choice.reason and choice.kind in choice.describe()


def test_a_gpu_gets_torch_at_fp16_unless_set():
    assert choose_engine("auto", "auto", on_gpu=True).kind == "torch"
    assert choose_engine("auto", "auto", on_gpu=True).precision == "fp16"
    assert choose_engine("torch", "bf16", on_gpu=True).precision == "bf16"


def test_bf16_on_a_cpu_without_torch_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs torch"):
        choose_engine("auto", "bf16", on_gpu=False, flags=AMX, has_torch=False)


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
