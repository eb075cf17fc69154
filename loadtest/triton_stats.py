"""Where the time went inside Triton: per-model statistics and metrics, snapshotted before and after a run.

Triton's statistics API (gRPC or HTTP, `/v2/models/stats`) keeps cumulative counters per model: requests,
executions and the nanoseconds spent queued, copying inputs, computing and copying outputs. The difference
of two snapshots, divided by the requests in between, is the mean time a request spent in each phase of
each model over that interval. The Prometheus metrics endpoint (`/metrics`) carries the same counters
plus failures by reason; both are read here without importing Locust, so the bench scripts can use them.
"""

from __future__ import annotations

import re
import urllib.request

STAGE_FIELDS = ("queue", "compute_input", "compute_infer", "compute_output")
STAGE_ORDER = ("tokenizer", "encoder", "postprocess", "ensemble")
# Counters (not gauges) of the metrics endpoint whose change over a run means something per model.
METRIC_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    # the stages' own (model_repository/stages/stage_metrics.py): the sequences the engine encoded, and the
    # requests refused unrun past their deadline; Triton counts a refused request among its inferences
    "bert_encoder_sequences_per_execute_sum",
    "bert_requests_expired_total",
)
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_statistics(raw: dict) -> dict[str, dict]:
    """Cumulative counters per model from the JSON of Triton's statistics API (gRPC as_json or HTTP)."""
    stats = {}
    for model in raw.get("model_stats", []):
        inference = model.get("inference_stats", {})
        stats[model["name"]] = {
            "inferences": int(model.get("inference_count", 0)),
            "executions": int(model.get("execution_count", 0)),
            **{f: int(inference.get(f, {}).get("ns", 0)) for f in STAGE_FIELDS},
            "requests": int(inference.get("success", {}).get("count", 0)),
            "request_ns": int(inference.get("success", {}).get("ns", 0)),
            "failures": int(inference.get("fail", {}).get("count", 0)),
        }
    return stats


def model_stats(client) -> dict[str, dict]:
    """Cumulative counters per model, from a tritonclient gRPC or HTTP InferenceServerClient."""
    if type(client).__module__.startswith("tritonclient.grpc"):
        return parse_statistics(client.get_inference_statistics(as_json=True))
    return parse_statistics(client.get_inference_statistics())


def statistics_client(url: str, protocol: str):
    """A blocking tritonclient for the statistics API at host:port over `protocol` (grpc or http)."""
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(url)
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=10)


def stage_breakdown(before: dict, after: dict) -> dict[str, dict]:
    """Per model: mean microseconds per request in each phase, and the mean executed batch size.

    `request_us` is the whole time a request spent in that model (for the ensemble: inside the server).
    """
    out = {}
    for name, end in after.items():
        start = before.get(name, dict.fromkeys(end, 0))
        requests = end["requests"] - start["requests"]
        executions = end["executions"] - start["executions"]
        if requests <= 0:
            continue
        out[name] = {f"{f}_us": round((end[f] - start[f]) / requests / 1e3, 1) for f in STAGE_FIELDS}
        if "request_ns" in end:
            out[name]["request_us"] = round((end["request_ns"] - start.get("request_ns", 0)) / requests / 1e3, 1)
            out[name]["requests"] = requests
            out[name]["failures"] = end["failures"] - start.get("failures", 0)
        if executions > 0:
            out[name]["mean_batch"] = round((end["inferences"] - start["inferences"]) / executions, 1)
    return out


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """{model: {counter: value}} from Prometheus text, summed over labels other than `model`; plus the
    server-wide gauges (nv_cpu_utilization, nv_gpu_utilization per GPU) under the key ""."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels = match["name"], dict(_LABEL.findall(match["labels"] or ""))
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if name in METRIC_COUNTERS and "model" in labels:
            model = out.setdefault(labels["model"], {})
            model[name] = model.get(name, 0.0) + value
        elif name in ("nv_cpu_utilization", "nv_gpu_utilization"):
            key = name if "gpu_uuid" not in labels else f"{name}[{labels['gpu_uuid'][:12]}]"
            out.setdefault("", {})[key] = value
    return out


def scrape_metrics(url: str, timeout_s: float = 10.0) -> dict[str, dict[str, float]]:
    """Triton's metrics at host:port (or a full http:// URL ending in /metrics)."""
    if not url.startswith(("http://", "https://")):
        url = f"http://{url}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_metrics(response.read().decode("utf-8", "replace"))


def metrics_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per model, the change of each counter over the run; the server gauges as read at the end."""
    out = {}
    for model, values in after.items():
        if model == "":
            out["server"] = dict(values)
            continue
        start = before.get(model, {})
        out[model] = {name: round(value - start.get(name, 0.0), 1) for name, value in values.items()}
    return out


def format_breakdown(stages: dict[str, dict]) -> list[str]:
    """Human-readable lines: per model, mean ms per request in each phase and the mean batch."""
    lines = [f"{'model':<12}{'requests':>10}{'queue':>9}{'input':>9}{'infer':>9}{'output':>9}{'total':>9}{'batch':>8}"]
    for name in sorted(stages, key=lambda n: (STAGE_ORDER.index(n) if n in STAGE_ORDER else len(STAGE_ORDER), n)):
        row = stages[name]
        total = row.get("request_us", sum(row.get(f"{f}_us", 0.0) for f in STAGE_FIELDS))
        phases = "".join(f"{row.get(f'{f}_us', 0.0) / 1e3:9.2f}" for f in STAGE_FIELDS)
        lines.append(
            f"{name:<12}{row.get('requests', 0):>10}{phases}{total / 1e3:9.2f}{row.get('mean_batch', 0.0):8.1f}"
        )
    return lines
