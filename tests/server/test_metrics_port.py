"""The launcher's metrics port (serving/launcher/metrics_port.py) in front of the real tritonserver: Triton's own
metrics pass, its GPU families give way to NVML's, and it answers while tritonserver is down."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from client import TextClient
from serving.launcher.gpu_metrics import FAMILIES, TRITON_GPU_FAMILIES, NvmlGpus
from serving.launcher.metrics_port import CONTENT_TYPE, MetricsProxy
from serving.launcher.triton_command import free_ports
from tests.support import H200_READING, NVML, SECOND_READING, Readings, families, metric_names, samples, scrape


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
    proxy = proxy_to(Readings(H200_READING, SECOND_READING))
    before = samples(scrape_proxy(proxy), "nv_inference_count", model="ensemble")
    with TextClient(server.grpc_url, "grpc", priority="ingestion") as client:  # the model, not its lane
        client.embed(["one request through the proxy", "two texts"])
    text = scrape_proxy(proxy)
    assert samples(text, "nv_inference_count", model="ensemble") == before + 2
    found = families(text)  # every family once: Triton's GPU families (if any) gave way to NVML's
    assert {"nv_inference_request_success", "nv_inference_queue_duration_us", "bert_tokenizer_tokens_total"} <= set(
        found
    )
    assert samples(text, "nv_gpu_utilization", gpu_uuid=H200_READING.uuid) == 0.87
    assert len(found["nv_gpu_utilization"][1]) == 2
    assert samples(text, "bert_gpu_sm_clock_hertz", gpu_uuid=H200_READING.uuid) == 1.98e9
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
    proxy = proxy_to(Readings(H200_READING), upstream=("127.0.0.1", nothing_listens))
    text = scrape_proxy(proxy)
    assert samples(text, "bert_launcher_tritonserver_metrics_up") == 0
    assert samples(text, "nv_gpu_memory_used_bytes", gpu_uuid=H200_READING.uuid) == 12_884_901_888
    assert set(families(text)) == {name for name, *_ in FAMILIES} | {"bert_launcher_tritonserver_metrics_up"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{proxy.server_port}/other", timeout=10)
    assert refused.value.code == 404


def test_proxy_refuses_a_busy_port_naming_the_setting(server):
    with pytest.raises(RuntimeError, match=rf"port {server.ports.grpc} on 127.0.0.1 \(server.metrics_port\)"):
        MetricsProxy("127.0.0.1", server.ports.grpc, ("127.0.0.1", server.ports.metrics), Readings())
