"""Does tritonserver join the caller's trace on every gRPC call? Starts the launcher with tracing on towards an
in-process OTLP receiver (sample rate 1, Triton's spans on), sends traced requests one at a time, through the API
front (`/v1/embeddings`) and straight to tritonserver over gRPC (tritonclient, the `traceparent` as a header), and
counts the calls whose trace holds no Triton span: Triton traced them under a trace id of its own.

    make export
    python docs/results/cpu-2026-12-06/triton-trace-context/trace_context_probe.py --requests 150 --pause 0.3
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.otlp_receiver import OtlpReceiver
from common.contract import TEXT_INPUT
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_settings


def traceparent() -> tuple[str, dict[str, str]]:
    trace_id = secrets.token_hex(16)
    return trace_id, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=150, help="a route")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between requests")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    receiver = OtlpReceiver()
    overrides = [f'tracing.endpoint="{receiver.url}"', "tracing.sample_rate=1.0", "tracing.triton_spans=true"]
    settings = load_settings(None, overrides)
    work = Path(tempfile.mkdtemp(prefix="trace-context-"))
    repository = generate(settings, settings.export_dir, work / "repository")
    ports = Ports.free()
    launcher = Launcher(settings.path, repository, ports, work / "launcher.log", overrides).start()
    sent: dict[str, list[str]] = {"api": [], "grpc": []}
    try:
        triton = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
        for index in range(args.requests):
            trace_id, headers = traceparent()
            answer = httpx.post(
                f"http://127.0.0.1:{ports.api}/v1/embeddings",
                json={"model": settings.model.name, "input": f"follow me {index}"},
                headers=headers,
                timeout=60,
            )
            answer.raise_for_status()
            sent["api"].append(trace_id)
            trace_id, headers = traceparent()
            text = grpcclient.InferInput(TEXT_INPUT, [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[f"follow me {index}".encode()]], dtype=object))
            triton.infer("ensemble", [text], headers=headers)
            sent["grpc"].append(trace_id)
            time.sleep(args.pause)
        time.sleep(15)  # Triton's exporter sends every 5 s
    finally:
        launcher.kill()
    with receiver.lock:
        joined = {span.trace_id for span in receiver.spans if span.service.endswith("-triton")}
    figures = {
        route: {"requests": len(ids), "without_triton_spans": sum(trace_id not in joined for trace_id in ids)}
        for route, ids in sent.items()
    }
    print(json.dumps(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
