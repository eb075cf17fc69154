"""python -m bench.cpu_throughput: texts/s through the Triton ensemble vs sentence-transformers encode().

Both run in the same process tree on the same machine and the same texts (loadtest/corpus.txt), one
after the other so each gets every core. The server side is the real tritonserver started from the
settings; the client is a lean asyncio gRPC loop with a fixed number of requests in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import grpc
import numpy as np
import torch
from tritonclient.grpc import service_pb2

from bench.e2e_bench import parse_shapes
from bench.engine_workload import cosine as embedding_cosine
from export.checkpoint import resolve_source
from loadtest.corpus import load_text
from model_repository.generate import generate
from protocol.kserve_grpc import GRPC_CHANNEL_ARGS, MODEL_INFER, model_infer_request
from serving.launcher.harness import local_server
from settings import load_settings


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def sentence_transformer(settings, warm_up: list[str], batch_size: int):
    """The reference model on the CPU, truncating where the served one does, its first encode() done. A random-init
    preset's reference is its export (the same weights and tokenizer; mean pooling, sentence-transformers' default
    and the export's)."""
    from sentence_transformers import SentenceTransformer

    folder = resolve_source(settings.model.source) or settings.export_dir
    model = SentenceTransformer(str(folder), device="cpu")
    model.max_seq_length = settings.max_tokens()
    model.encode(warm_up[:64], batch_size=batch_size)
    return model


def encode_rate(model, texts: list[str], batch_size: int) -> tuple[float, np.ndarray]:
    """(texts/s of model.encode() on texts, the embeddings)."""
    started = time.perf_counter()
    embeddings = model.encode(texts, batch_size=batch_size)
    return len(texts) / (time.perf_counter() - started), embeddings


def sentence_transformers_rate(settings, texts: list[str], batch_size: int) -> tuple[float, np.ndarray]:
    return encode_rate(sentence_transformer(settings, texts, batch_size), texts, batch_size)


async def ensemble_rate(
    url: str, texts: list[str], per_request: int, concurrency: int
) -> tuple[float, float, np.ndarray]:
    """(texts/s, client CPU us per request, the served embeddings in text order): `concurrency` requests in
    flight over one gRPC channel.

    The client shares the cores it measures, so it is lean: each request is serialized before the clock
    starts (client.core.model_infer_request) and sent as raw bytes; the answer is parsed and checked, and its
    bytes kept for after the clock."""
    starts = range(0, len(texts), per_request)
    requests = [model_infer_request("ensemble", texts[i : i + per_request]) for i in starts]
    answers: list[bytes] = [b""] * len(requests)
    async with grpc.aio.insecure_channel(url, options=GRPC_CHANNEL_ARGS) as channel:
        infer = channel.unary_unary(MODEL_INFER, response_deserializer=service_pb2.ModelInferResponse.FromString)
        await infer(requests[0], timeout=120)
        queue = iter(enumerate(requests))

        async def worker() -> None:
            for index, request in queue:
                response = await infer(request, timeout=120)
                if not response.outputs or response.outputs[0].shape[0] < 1:
                    raise RuntimeError(f"unexpected answer: {response}")
                answers[index] = response.raw_output_contents[0]

        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    embeddings = np.frombuffer(b"".join(answers), dtype=np.float32).reshape(len(texts), -1)
    return len(texts) / wall, cpu / len(requests) * 1e6, embeddings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_throughput", description=__doc__)
    parser.add_argument("--settings")
    parser.add_argument("--texts", type=int, default=1500)
    parser.add_argument("--st-batch-size", type=int, default=32, help="sentence-transformers encode() batch size")
    parser.add_argument(
        "--shapes", default="1x64,8x16,32x8", help="client load shapes, TEXTS_PER_REQUESTxCONCURRENCY, comma separated"
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="settings override")
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="results folder (default build/bench)")
    args = parser.parse_args(argv)
    settings = load_settings(args.settings, args.set)
    texts = load_text()[: args.texts]

    reference, expected = sentence_transformers_rate(settings, texts, args.st_batch_size)
    print(f"sentence-transformers encode(batch_size={args.st_batch_size}): {reference:.1f} texts/s", flush=True)
    choice = settings.engine_choice()
    print(f"served: {choice.describe()}", flush=True)
    runs = []
    bench_dir = settings.build_dir / "bench"
    # Its own repository, generated from these settings and overrides (not whatever `make repo` left).
    repository = generate(settings, settings.export_dir, bench_dir / "repository")
    with local_server(settings, repository, bench_dir) as server:
        for per_request, concurrency in parse_shapes(args.shapes):
            rate, client_us, served = asyncio.run(ensemble_rate(server.grpc_url, texts, per_request, concurrency))
            cosine = float(embedding_cosine(served, expected).min())
            runs.append(
                {
                    "texts_per_request": per_request,
                    "concurrency": concurrency,
                    "texts_per_s": round(rate, 1),
                    "ratio_vs_sentence_transformers": round(rate / reference, 2),
                    "client_cpu_us_per_request": round(client_us, 1),
                    "min_cosine_to_sentence_transformers": round(cosine, 6),
                }
            )
            print(
                f"ensemble {per_request} text(s)/request x {concurrency} in flight: {rate:.1f} texts/s "
                f"= {rate / reference:.2f}x, cosine to sentence-transformers >= {cosine:.6f}",
                flush=True,
            )
    result = {
        "benchmark": "cpu_throughput",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "command": "python -m bench.cpu_throughput " + " ".join(argv if argv is not None else sys.argv[1:]),
        "topology": settings.topology,
        "overrides": args.set,
        "model": settings.model.name,
        "engine": choice.kind,
        "precision": choice.precision,
        "engine_choice": choice.reason,
        "texts": len(texts),
        "sentence_transformers_texts_per_s": round(reference, 1),
        "ensemble": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cpu_throughput-{result['date']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
