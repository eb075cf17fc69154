"""TensorRT optimization profiles and CUDA-graph batch sizes from the settings: what `make engines` builds
(export/tensorrt.py) and what the generated encoder config declares (model_repository/generate.py) agree."""

from __future__ import annotations

from settings.schema import Settings


def profiles(settings: Settings) -> list[dict]:
    """One optimization profile per sequence bucket: lengths (previous bucket, bucket], any batch size.

    Every profile admits the encoder's whole max_batch_size, since Triton's dynamic batcher forms batches
    without looking at lengths; each is tuned (opt) at the bucket length for tokens_per_batch tokens.
    """
    max_batch = settings.encoder.max_batch_size
    buckets = settings.tensorrt.sequence_buckets
    out = []
    for index, length in enumerate(buckets):
        shortest = buckets[index - 1] + 1 if index else 1
        opt_batch = max(1, min(max_batch, settings.tensorrt.tokens_per_batch // length))
        out.append({"min": [1, shortest], "opt": [opt_batch, length], "max": [max_batch, length]})
    return out


def graph_batches(settings: Settings, length: int) -> list[int]:
    """Batch sizes Triton captures a CUDA graph for at one bucket length: powers of two up to the cap."""
    cap = min(settings.tensorrt.max_graph_batch, settings.encoder.max_batch_size)
    sizes, size = [], 1
    while size <= cap:
        sizes.append(size)
        size *= 2
    return sizes
