"""Where the torch engine's time goes, for python -m bench.engine_bench --profile / --diagnose: GPU kernel time by
kind for one batch (eager, so each kernel shows), and the host/GPU split of one largest-batch call with the time of
its captured CUDA graph replayed alone."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences

KERNEL_GROUPS = (
    ("gemm", ("gemm", "sm90", "cutlass", "nvjet", "cublas", "xmma")),
    ("attention", ("varlen_attn", "flash", "fmha", "attention")),
    ("layernorm", ("add_ln", "layer_norm")),
    ("gelu", ("gelu",)),
    ("embedding", ("embed",)),
    ("pooling", ("pool", "index_add", "scatter")),
    ("copies", ("memcpy", "memset", "copy")),
)


def diagnose(model_dir, device, base_opts, batch, reps: int = 20) -> dict:
    """Where one call's time goes, on the served path (its CUDA graph): packing, launching (Engine.submit returns
    once the batch, its copy in and its rows' copy out are queued) and waiting for its rows, against the graph alone
    replayed back to back (GPU time with no host work) and replayed once and waited for."""
    eng = load_engine("torch", model_dir, device, {**base_opts, "max_graph_tokens": 65536})
    ids, lengths = pack_sequences(batch)
    eng.forward_packed(ids, lengths)  # captures this batch's graph
    eng.forward_packed(ids, lengths)
    acc = {"pack_ms": 0.0, "launch_ms": 0.0, "wait_ms": 0.0, "call_ms": 0.0}
    for _ in range(reps):
        t0 = time.perf_counter()
        ids, lengths = pack_sequences(batch)
        t1 = time.perf_counter()
        rows = eng.submit(ids, lengths)
        t2 = time.perf_counter()
        rows()
        t3 = time.perf_counter()
        for key, seconds in (("pack_ms", t1 - t0), ("launch_ms", t2 - t1), ("wait_ms", t3 - t2), ("call_ms", t3 - t0)):
            acc[key] += seconds * 1e3 / reps
    (graph, _), *_ = eng._graphs.values()
    with torch.cuda.stream(eng.stream):
        graph.replay()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(30):
            graph.replay()
        stop.record()
    stop.synchronize()
    acc["graph_replay_ms"] = start.elapsed_time(stop) / 30
    once = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.cuda.stream(eng.stream):
            graph.replay()
        eng.stream.synchronize()
        once.append(time.perf_counter() - t0)
    acc["graph_replay_waited_ms"] = sorted(once)[len(once) // 2] * 1e3
    acc["graph_tokens"], acc["graph_sequences"] = next(iter(eng._graphs))[:2]
    acc["tokens"] = int(lengths.sum())
    del eng
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in acc.items()}


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
