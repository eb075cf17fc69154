"""Where the torch engine's time goes, for python -m bench.engine_bench --profile / --diagnose: GPU kernel time by
kind for one batch (eager, so each kernel shows), and the host/GPU split of one large-batch call with the time of
its captured CUDA graph replayed alone."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.engines.torch_layout import layout_size, pack, views

KERNEL_GROUPS = (
    ("gemm", ("gemm", "sm90", "cutlass", "nvjet", "cublas", "xmma")),
    ("attention", ("varlen_attn", "flash", "fmha", "attention")),
    ("layernorm", ("add_ln", "layer_norm")),
    ("gelu", ("gelu",)),
    ("embedding", ("embed",)),
    ("pooling", ("pool", "index_add", "scatter")),
    ("copies", ("memcpy", "memset", "copy")),
)


def diagnose(model_dir, device, base_opts, batch, reps: int = 10) -> dict:
    """Where one large-batch call spends its time: host phases of the eager path, GPU span, graph replay alone."""
    eng = load_engine("torch", model_dir, device, {**base_opts, "max_graph_tokens": 65536})
    n = len(batch)
    acc: dict[str, float] = {}
    for rep in range(reps + 2):
        t0 = time.perf_counter()
        packed, lens = pack_sequences(batch)
        tokens, max_len = int(lens.sum()), int(lens.max())
        size = layout_size(tokens, n, eng.tile_block)
        if size > eng._host_in.numel():
            eng._host_in = torch.empty(size, dtype=torch.int32, pin_memory=True)
        pack(eng._host_in.numpy()[:size], packed, lens, tokens, n, eng.tile_block)
        t1 = time.perf_counter()
        with torch.inference_mode(), torch.cuda.stream(eng.stream):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            dev = eng._host_in[:size].to(eng.torch_device, non_blocking=True)
            ids, cu, tiles = views(dev, tokens, n, eng.tile_block)
            out = eng._encode(ids, cu, tiles, n, max_len)
            e1.record()
            t2 = time.perf_counter()
            eng._host_out[:n].copy_(out[:n], non_blocking=True)
            eng.stream.synchronize()
        t3 = time.perf_counter()
        eng._host_out[:n].numpy().copy()
        t4 = time.perf_counter()
        if rep >= 2:
            for k, v in (
                ("host_pack_ms", t1 - t0),
                ("launch_ms", t2 - t1),
                ("wait_ms", t3 - t2),
                ("numpy_out_ms", t4 - t3),
                ("total_ms", t4 - t0),
                ("gpu_span_ms", e0.elapsed_time(e1) / 1e3),
            ):
                acc[k] = acc.get(k, 0.0) + v * 1e3 / reps
    # The captured graph for this batch, replayed back to back: GPU time with no host work at all.
    eng.forward(batch)
    (graph, _), *_ = eng._graphs.values()
    with torch.cuda.stream(eng.stream):
        graph.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(30):
            graph.replay()
        e1.record()
    e1.synchronize()
    acc["graph_replay_ms"] = e0.elapsed_time(e1) / 30
    acc["graph_tokens"] = next(iter(eng._graphs))[0]
    acc["tokens"] = int(sum(len(s) for s in batch))
    del eng
    return acc


def profile_engine(model_dir, device, base_opts, batch, out_dir: Path) -> dict:
    """Kernel time by kind for one batch, eager (no graphs) so that each kernel shows."""
    from torch.profiler import ProfilerActivity, profile

    eng = load_engine("torch", model_dir, device, {**base_opts, "cuda_graphs": False})
    for _ in range(3):
        eng.forward(batch)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            eng.forward(batch)
    groups: dict[str, float] = {}
    rows = []
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if not t:
            continue
        name = evt.key
        low = name.lower()
        kind = next((g for g, keys in KERNEL_GROUPS if any(k in low for k in keys)), "other")
        groups[kind] = groups.get(kind, 0.0) + t / 3 / 1e3
        rows.append((t / 3 / 1e3, evt.count // 3, kind, name[:110]))
    rows.sort(reverse=True)
    text = "\n".join(f"{ms:8.3f} ms  x{n:<4} {kind:<10} {name}" for ms, n, kind, name in rows[:40])
    (out_dir / "engine_profile.txt").write_text(text + "\n")
    del eng
    return {"batch": len(batch), "ms_per_forward_by_kind": groups, "total_ms": sum(groups.values())}
