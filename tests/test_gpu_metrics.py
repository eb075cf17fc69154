"""GPU metrics on the metrics port: NVML's readings as Prometheus text under Triton's names, and the launcher's
metrics proxy in front of the real tritonserver (Triton's own metrics pass, its GPU families give way to NVML's).

There is no GPU here: the formatter and the proxy's NVML path take readings passed in (GpuReading); the
"no NVML" path is this machine's own; test_nvml_reads_every_gpu runs where NVML sees a GPU.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from client import TextClient
from serving.launcher.gpu_metrics import FAMILIES, TRITON_GPU_FAMILIES, GpuReading, NvmlGpus, format_readings
from serving.launcher.metrics_port import CONTENT_TYPE, MetricsProxy, without_families
from serving.launcher.triton_command import Ports, free_ports, server_command
from tests.support import metric_names, samples, scrape

H200 = GpuReading(
    uuid="GPU-6e1c3c2f-0b7e-4a55-9f2e-1d2c3b4a5f60",
    utilization=0.87,
    memory_used_bytes=12_884_901_888,
    memory_total_bytes=150_754_820_096,
    power_watts=412.5,
    power_limit_watts=700.0,
    energy_joules=5321.25,
    sm_clock_hz=1_980_000_000.0,
)
SECOND = GpuReading(uuid="GPU-00000000-0000-0000-0000-000000000002", utilization=0.0, memory_used_bytes=0)


class Readings:
    """A stand-in for NvmlGpus that reports the readings it was given."""

    problem = None

    def __init__(self, *readings: GpuReading) -> None:
        self.readings = list(readings)

    available = property(lambda self: bool(self.readings))

    def __len__(self) -> int:
        return len(self.readings)

    def read(self) -> list[GpuReading]:
        return self.readings


def families(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (TYPE, sample lines); fails on a family declared twice or a sample before its TYPE."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in found, f"family {name} declared twice"
            found[name], current = (kind, []), name
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][\w:]*", line).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert current in (name, base), f"sample {name} outside its family ({current})"
            found[current][1].append(line)
    return found


# ---------------------------------------------------------------------------------------------------------
# NVML readings as Prometheus text
# ---------------------------------------------------------------------------------------------------------
def test_readings_use_tritons_names_units_and_gpu_uuid_label():
    text = format_readings([H200])
    uuid = {"gpu_uuid": H200.uuid}
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
    assert "nv_gpu_memory_used_bytes{" + f'gpu_uuid="{H200.uuid}"' + "} 12884901888\n" in text  # integers stay so
    assert {name for name in kinds if name.startswith("nv_")} == TRITON_GPU_FAMILIES
    assert text.endswith("\n")


def test_one_sample_per_gpu_and_no_family_for_what_nvml_does_not_report():
    text = format_readings([H200, SECOND])
    found = families(text)
    assert len(found["nv_gpu_utilization"][1]) == 2 and len(found["nv_gpu_memory_used_bytes"][1]) == 2
    assert len(found["nv_gpu_power_usage"][1]) == 1  # SECOND reports no power
    assert samples(text, "nv_gpu_utilization", gpu_uuid=SECOND.uuid) == 0.0
    only_uuid = format_readings([GpuReading(uuid=SECOND.uuid)])
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


# ---------------------------------------------------------------------------------------------------------
# NVML itself
# ---------------------------------------------------------------------------------------------------------
NVML = NvmlGpus()


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


# ---------------------------------------------------------------------------------------------------------
# The metrics proxy in front of the real tritonserver
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture()
def proxy_to(server):
    """proxy_to(gpus, upstream=Triton's metrics): a MetricsProxy on a free port, serving until the test ends."""
    started = []

    def start(gpus, upstream=("127.0.0.1", server.ports.metrics)) -> MetricsProxy:
        proxy = MetricsProxy("127.0.0.1", free_ports(1)[0], upstream, gpus)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.shutdown()
        proxy.server_close()


def scrape_proxy(proxy: MetricsProxy) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.server_port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"] == CONTENT_TYPE
        return response.read().decode()


def test_proxy_serves_tritons_metrics_with_nvmls_gpu_families(server, proxy_to):
    proxy = proxy_to(Readings(H200, SECOND))
    before = samples(scrape_proxy(proxy), "nv_inference_count", model="ensemble")
    with TextClient(server.grpc_url, "grpc") as client:
        client.embed(["one request through the proxy", "two texts"])
    text = scrape_proxy(proxy)
    assert samples(text, "nv_inference_count", model="ensemble") == before + 2
    found = families(text)  # every family once: Triton's GPU families (if any) gave way to NVML's
    assert {"nv_inference_request_success", "nv_inference_queue_duration_us", "bert_tokenizer_tokens_total"} <= set(
        found
    )
    assert samples(text, "nv_gpu_utilization", gpu_uuid=H200.uuid) == 0.87
    assert len(found["nv_gpu_utilization"][1]) == 2
    assert samples(text, "bert_gpu_sm_clock_hertz", gpu_uuid=H200.uuid) == 1.98e9
    assert samples(text, "bert_launcher_tritonserver_metrics_up") == 1
    assert "GPU metrics of 2 GPU(s) from NVML" in proxy.describe()


def test_proxy_without_nvml_passes_tritons_metrics_unchanged(server, proxy_to):
    proxy = proxy_to(NvmlGpus() if not NVML.available else Readings())
    text = scrape_proxy(proxy)
    triton = scrape(server.host, server.ports.metrics)
    ours = {"bert_launcher_tritonserver_metrics_up"}
    assert metric_names(text) - ours == metric_names(triton)
    assert not metric_names(text) & TRITON_GPU_FAMILIES  # CPU-only: Triton runs with --allow-gpu-metrics=false
    assert text.startswith(triton.splitlines()[0] + "\n")
    assert "no GPU metrics on the metrics port" in proxy.describe()


def test_proxy_answers_with_the_gpu_metrics_while_tritonserver_is_down(proxy_to):
    (nothing_listens,) = free_ports(1)
    proxy = proxy_to(Readings(H200), upstream=("127.0.0.1", nothing_listens))
    text = scrape_proxy(proxy)
    assert samples(text, "bert_launcher_tritonserver_metrics_up") == 0
    assert samples(text, "nv_gpu_memory_used_bytes", gpu_uuid=H200.uuid) == 12_884_901_888
    assert set(families(text)) == {name for name, *_ in FAMILIES} | {"bert_launcher_tritonserver_metrics_up"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{proxy.server_port}/other", timeout=10)
    assert refused.value.code == 404


def test_proxy_refuses_a_busy_port_naming_the_setting(server):
    with pytest.raises(RuntimeError, match=rf"port {server.ports.grpc} on 127.0.0.1 \(server.metrics_port\)"):
        MetricsProxy("127.0.0.1", server.ports.grpc, ("127.0.0.1", server.ports.metrics), Readings())


def test_launcher_ports_put_tritons_metrics_on_loopback_behind_the_proxy():
    ports = Ports(8000, 8001, 8002, 8003, 8010, triton_metrics=41234)
    assert ports.triton_metrics_address("0.0.0.0") == ("127.0.0.1", 41234)
    assert Ports.free().triton_metrics == 0  # TritonServer alone: Triton's metrics on `metrics` itself
    assert Ports(8000, 8001, 8002).triton_metrics_address("0.0.0.0") == ("0.0.0.0", 8002)
    command = server_command(Path("tritonserver"), Path("repo"), Path("backends"), ports, "0.0.0.0", 10)
    assert "--metrics-address=127.0.0.1" in command and "--metrics-port=41234" in command
