"""GPU utilization, memory, power and SM clock sampled through NVML while a benchmark runs.

Triton's own nv_gpu_utilization needs DCGM, which the wheel's tritonserver lacks (it reads 0); NVML answers
directly. The readings are the metrics port's own (serving/launcher/gpu_metrics.py). Without nvidia-ml-py or
a GPU the sampler records nothing and says why.
"""

from __future__ import annotations

import threading

from serving.launcher.gpu_metrics import GpuReading, NvmlGpus


class GpuSampler:
    """`with GpuSampler(interval_s) as gpu: ...`; then gpu.summary(): per GPU means and peaks over the block."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: dict[int, list[GpuReading]] = {}
        self.problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: NvmlGpus | None = None

    def __enter__(self) -> GpuSampler:
        self._gpus = NvmlGpus()
        if not self._gpus.available:
            self.problem = f"no NVML: {self._gpus.problem}"
            return self
        self.samples = {index: [] for index in range(len(self._gpus))}
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for index, reading in enumerate(self._gpus.read()):
                self.samples[index].append(reading)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def summary(self) -> dict:
        if self.problem:
            return {"problem": self.problem}
        out = {}
        for index, readings in self.samples.items():
            rows = [
                (r.utilization * 100, r.memory_used_bytes >> 20, r.power_watts, r.sm_clock_hz / 1e6)
                for r in readings
                if None not in (r.utilization, r.memory_used_bytes, r.power_watts, r.sm_clock_hz)
            ]
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
