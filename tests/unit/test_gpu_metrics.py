"""GPU metrics as Prometheus text: NVML's readings under Triton's names, units and gpu_uuid label.

There is no GPU here: the formatter takes readings passed in (GpuReading); the "no NVML" path is this
machine's own; test_nvml_reads_every_gpu runs where NVML sees a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.launcher.gpu_metrics import FAMILIES, TRITON_GPU_FAMILIES, GpuReading, format_readings
from serving.launcher.metrics_port import without_families
from serving.launcher.triton_command import Ports, server_command
from tests.support import H200_READING, NVML, SECOND_READING, families, samples


# ---------------------------------------------------------------------------------------------------------
# NVML readings as Prometheus text
# ---------------------------------------------------------------------------------------------------------
def test_readings_use_tritons_names_units_and_gpu_uuid_label():
    text = format_readings([H200_READING])
    uuid = {"gpu_uuid": H200_READING.uuid}
    assert samples(text, "nv_gpu_utilization", **uuid) == 0.87  # a 0..1 ratio, as Triton's
    assert samples(text, "nv_gpu_memory_used_bytes", **uuid) == 12_884_901_888
    assert samples(text, "nv_gpu_memory_total_bytes", **uuid) == 150_754_820_096
    assert samples(text, "nv_gpu_power_usage", **uuid) == 412.5  # watts
    assert samples(text, "nv_gpu_power_limit", **uuid) == 700
    assert samples(text, "nv_energy_consumption", **uuid) == 5321.25  # joules
    assert samples(text, "bert_gpu_sm_clock_hertz", **uuid) == 1.98e9
    kinds = {name: kind for name, (kind, _) in families(text).items()}
    assert kinds == {name: kind for name, kind, *_ in FAMILIES}
    assert kinds["nv_energy_consumption"] == "counter" and kinds["nv_gpu_utilization"] == "gauge"
    used = "nv_gpu_memory_used_bytes{" + f'gpu_uuid="{H200_READING.uuid}"' + "} 12884901888\n"
    assert used in text  # integers stay so
    assert {name for name in kinds if name.startswith("nv_")} == TRITON_GPU_FAMILIES
    assert text.endswith("\n")


def test_one_sample_per_gpu_and_no_family_for_what_nvml_does_not_report():
    text = format_readings([H200_READING, SECOND_READING])
    found = families(text)
    assert len(found["nv_gpu_utilization"][1]) == 2 and len(found["nv_gpu_memory_used_bytes"][1]) == 2
    assert len(found["nv_gpu_power_usage"][1]) == 1  # SECOND_READING reports no power
    assert samples(text, "nv_gpu_utilization", gpu_uuid=SECOND_READING.uuid) == 0.0
    only_uuid = format_readings([GpuReading(uuid=SECOND_READING.uuid)])
    assert only_uuid == "" == format_readings([])


def test_tritons_gpu_families_are_dropped_and_the_rest_kept():
    triton = "\n".join(
        [
            "# HELP nv_inference_count Number of inferences performed (does not include cached requests)",
            "# TYPE nv_inference_count counter",
            'nv_inference_count{model="ensemble",version="1"} 3',
            "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
            "# TYPE nv_gpu_utilization gauge",
            'nv_gpu_utilization{gpu_uuid="GPU-x"} 0',
            "# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started",
            "# TYPE nv_energy_consumption counter",
            'nv_energy_consumption{gpu_uuid="GPU-x"} 0',
            "# HELP nv_gpu_utilization_extra not one of ours: kept",
            "# TYPE nv_gpu_utilization_extra gauge",
            "nv_gpu_utilization_extra 1",
        ]
    )
    kept = without_families(triton, TRITON_GPU_FAMILIES)
    assert set(families(kept)) == {"nv_inference_count", "nv_gpu_utilization_extra"}
    assert 'nv_inference_count{model="ensemble",version="1"} 3\n' in kept


@pytest.mark.skipif(NVML.available, reason="NVML sees a GPU here")
def test_without_nvml_there_are_no_readings_and_the_reason_is_said():
    assert NVML.problem and NVML.read() == [] and len(NVML) == 0
    assert "NVML" in NVML.problem or "nvidia-ml-py" in NVML.problem


@pytest.mark.skipif(not NVML.available, reason=f"no GPU through NVML here: {NVML.problem}")
def test_nvml_reads_every_gpu():
    readings = NVML.read()
    assert len(readings) == len(NVML) >= 1
    for reading in readings:
        assert reading.uuid.startswith(("GPU-", "MIG-"))
        assert 0 < reading.memory_used_bytes <= reading.memory_total_bytes
        assert reading.utilization is None or 0 <= reading.utilization <= 1
        assert reading.power_watts is None or reading.power_watts > 0
        assert reading.sm_clock_hz is None or reading.sm_clock_hz >= 1e6
    assert set(families(format_readings(readings))) >= {"nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}


def test_launcher_ports_put_tritons_metrics_on_loopback_behind_the_proxy():
    ports = Ports(8000, 8001, 8002, 8003, 8010, triton_metrics=41234)
    assert ports.triton_metrics_address("0.0.0.0") == ("127.0.0.1", 41234)
    assert Ports.free().triton_metrics == 0  # TritonServer alone: Triton's metrics on `metrics` itself
    assert Ports(8000, 8001, 8002).triton_metrics_address("0.0.0.0") == ("0.0.0.0", 8002)
    command = server_command(Path("tritonserver"), Path("repo"), Path("backends"), ports, "0.0.0.0", 10)
    assert "--metrics-address=127.0.0.1" in command and "--metrics-port=41234" in command
