"""Per-GPU metrics read through NVML (nvidia-ml-py), as Prometheus text, under Triton's names where it has them.

The wheel's tritonserver reads its GPU metrics through DCGM, which it lacks: there nv_gpu_utilization stays 0.
NVML, which the driver itself ships, answers directly; metrics_port.py puts these families in place of
Triton's on the metrics port. Names, units and the gpu_uuid label follow Triton's metrics docs
(nv_gpu_utilization is a 0..1 ratio, power in watts, nv_energy_consumption a counter of joules); the SM
clock, which Triton does not export, is bert_gpu_sm_clock_hertz. Every GPU NVML sees is reported (in a
container: the GPUs given to it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; None where NVML does not report the value (e.g. utilization of a MIG parent)."""

    uuid: str
    utilization: float | None = None  # 0..1, over NVML's last sample period
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since this process first read the GPU
    sm_clock_hz: float | None = None


# (metric, type, help, GpuReading field), in the order they are written.
FAMILIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0) (NVML)", "utilization"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes (NVML)", "memory_total_bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes (NVML)", "memory_used_bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts (NVML)", "power_watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts (NVML)", "power_limit_watts"),
    (
        "nv_energy_consumption",
        "counter",
        "GPU energy consumption in joules since the launcher started (NVML)",
        "energy_joules",
    ),
    ("bert_gpu_sm_clock_hertz", "gauge", "GPU SM (streaming multiprocessor) clock in hertz (NVML)", "sm_clock_hz"),
)
# Triton's own GPU families that these replace on the metrics port (one family of each name).
TRITON_GPU_FAMILIES = frozenset(name for name, *_ in FAMILIES if name.startswith("nv_"))
assert {f.name for f in dataclasses.fields(GpuReading)} == {"uuid", *(field for *_, field in FAMILIES)}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def format_readings(readings: list[GpuReading]) -> str:
    """Prometheus text (format 0.0.4): HELP and TYPE per family, one sample per GPU that reports it."""
    lines = []
    for name, kind, help_text, field in FAMILIES:
        values = [(r.uuid, getattr(r, field)) for r in readings if getattr(r, field) is not None]
        if not values:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{gpu_uuid="{uuid}"}} {_number(value)}' for uuid, value in values]
    return "\n".join(lines) + "\n" if lines else ""


class NvmlGpus:
    """This machine's GPUs through NVML. `problem` says why there are none (no nvidia-ml-py, no driver, no
    GPU); read() then returns nothing."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self._nvml = None
        self._handles: list = []
        self._energy_start_mj: dict[str, int] = {}
        try:
            import pynvml
        except ImportError:
            self.problem = "nvidia-ml-py (pynvml) is not installed"
            return
        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            self.problem = f"NVML: {exc}"
            return
        if not self._handles:
            self.problem = "NVML sees no GPU"
            return
        self._nvml = pynvml
        self.read()  # the energy counters start here

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def __len__(self) -> int:
        return len(self._handles) if self.available else 0

    def read(self) -> list[GpuReading]:
        return [reading for reading in map(self._read, self._handles) if reading] if self.available else []

    def _read(self, handle) -> GpuReading | None:
        nvml = self._nvml

        def value(call, *args):
            try:
                return call(handle, *args)
            except nvml.NVMLError:  # not supported on this GPU (or this MIG mode), or the GPU fell off the bus
                return None

        uuid = value(nvml.nvmlDeviceGetUUID)
        if uuid is None:
            return None
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        utilization = value(nvml.nvmlDeviceGetUtilizationRates)
        memory = value(nvml.nvmlDeviceGetMemoryInfo)
        power_mw = value(nvml.nvmlDeviceGetPowerUsage)
        limit_mw = value(nvml.nvmlDeviceGetPowerManagementLimit)
        energy_mj = value(nvml.nvmlDeviceGetTotalEnergyConsumption)  # since the driver loaded
        clock_mhz = value(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM)
        energy_j = None
        if energy_mj is not None:
            start = self._energy_start_mj.setdefault(uuid, energy_mj)
            energy_j = max(energy_mj - start, 0) / 1000
        return GpuReading(
            uuid=uuid,
            utilization=utilization.gpu / 100 if utilization is not None else None,
            memory_used_bytes=memory.used if memory is not None else None,
            memory_total_bytes=memory.total if memory is not None else None,
            power_watts=power_mw / 1000 if power_mw is not None else None,
            power_limit_watts=limit_mw / 1000 if limit_mw is not None else None,
            energy_joules=energy_j,
            sm_clock_hz=clock_mhz * 1e6 if clock_mhz is not None else None,
        )
