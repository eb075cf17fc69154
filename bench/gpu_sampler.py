"""GPU utilization, memory, power and SM clock sampled through NVML (nvidia-ml-py) while a benchmark runs.

Triton's own nv_gpu_utilization needs DCGM, which the wheel's tritonserver lacks (it reads 0); NVML answers
directly. Without nvidia-ml-py or a GPU the sampler records nothing and says why.
"""

from __future__ import annotations

import threading


class GpuSampler:
    """`with GpuSampler(interval_s) as gpu: ...`; then gpu.summary(): per GPU means and peaks over the block."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: dict[int, list[tuple[int, int, float, int]]] = {}
        self.problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []
        self._nvml = None

    def __enter__(self) -> GpuSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # no nvidia-ml-py, no driver, no GPU
            self.problem = f"no NVML: {exc}"
            return self
        self.samples = {index: [] for index in range(len(self._handles))}
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(self.interval_s):
            for index, handle in enumerate(self._handles):
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
                clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
                self.samples[index].append((util.gpu, memory.used >> 20, power_w, clock))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def summary(self) -> dict:
        if self.problem:
            return {"problem": self.problem}
        out = {}
        for index, rows in self.samples.items():
            if not rows:
                continue
            util, memory, power, clock = zip(*rows, strict=True)
            out[f"gpu{index}"] = {
                "utilization_pct_mean": round(sum(util) / len(util), 1),
                "memory_used_mib_max": max(memory),
                "power_w_mean": round(sum(power) / len(power), 1),
                "sm_clock_mhz_mean": round(sum(clock) / len(clock)),
                "samples": len(rows),
            }
        return out
