"""Engine-only benchmark of torch_engine on BERT-base against transformers fp16 (SDPA, padded batches).

    python -m bench.engine_bench --out DIR [--variants] [--device cuda:0]

Model: BertConfig() sizes (12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522) with random
weights (normal(0, 0.02) as transformers initializes them, seed 0), written as config.json + model.safetensors
+ serving.json (mean pooling, L2 normalize) into a temporary folder; the engine loads it without transformers.

Lengths: L = clip(round(exp(N(mu, 0.5))), 8, 128) with mu = ln(45) - 0.5**2 / 2 (a lognormal whose unclipped
mean is 45), numpy default_rng(1234); token ids uniform in [1000, 30000) between [CLS] (101) and [SEP] (102).

Each timed call is what the Triton encoder stage sees: a list of host int32 arrays in, a host float32
[N, 768] array out (packing, copies and synchronization included). For each batch size a fixed set of
batches is drawn, run once untimed (this captures the engine's CUDA graphs for the buckets they hit), then
timed in rounds; sequences/s = sequences / summed call time, p50/p99 over the calls. The transformers
baseline pads every batch to its longest sequence and computes the same pooling + normalize, in the same run.
Writes DIR/engine_bench.json and prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from bench.engine_profile import diagnose, profile_engine
from bench.engine_workload import (
    BATCH_SIZES,
    MEAN_LEN,
    SIGMA,
    batches_for,
    cosine,
    draw_lengths,
    memory_peak,
    spin_up,
    time_calls,
    write_bert_base,
)
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.engines.torch_layout import layout_size, pack, token_bucket

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------
class HFBaseline:
    """transformers BertModel (SDPA), each batch padded to its longest sequence, same pooling + normalize."""

    def __init__(self, model_dir: Path, device: str, dtype: torch.dtype) -> None:
        from transformers import BertModel

        self.device = device
        self.model = BertModel.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
        self.model = self.model.to(device).eval()

    @torch.inference_mode()
    def __call__(self, seqs: list[np.ndarray]) -> np.ndarray:
        width = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
        mask_t = torch.from_numpy(mask).to(self.device, non_blocking=True)
        hidden = self.model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state.float()
        m = mask_t[..., None].float()
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


VARIANTS = [
    ("default", {}),
    ("gelu=exact (Triton erf kernel)", {"gelu": "exact"}),
    ("residual_gemm=false", {"residual_gemm": False}),
    ("attn=flash (aten FA2 varlen)", {"attention": "flash"}),
    ("kernels=torch ops", {"kernels": "torch"}),
    ("all torch: flash, torch ops, exact", {"attention": "flash", "kernels": "torch", "gelu": "exact"}),
    ("bf16", {"precision": "bf16"}),
    ("no CUDA graphs", {"cuda_graphs": False}),
    ("graphs up to 65536 tokens", {"max_graph_tokens": 65536}),
    ("attn warps 2", {"attn_warps": 2}),
    ("attn warps 8", {"attn_warps": 8}),
    ("attn stages 1", {"attn_stages": 1}),
    ("attn stages 3", {"attn_stages": 3}),
    ("attn tiles 32x64", {"attn_block_m": 32, "attn_block_n": 64}),
]


def time_pipelined(engine, batches: list, min_calls: int = 24, min_seconds: float = 0.5) -> dict:
    """Engine.submit with two batches in flight (batch n + 1 launched, then batch n collected): sequences per
    second, and the largest difference of two overlapped batches' rows from forward()'s."""
    packed = [pack_sequences(batch) for batch in batches]
    pair = [packed[0], packed[1 % len(packed)]]
    expected = [engine.forward_packed(*batch) for batch in pair]
    overlapped = [engine.submit(*batch) for batch in pair]
    diff = max(float(np.abs(wait() - rows).max()) for wait, rows in zip(overlapped, expected, strict=True))
    calls, sequences, pending = 0, 0, None
    started = time.perf_counter()
    while calls < min_calls or time.perf_counter() - started < min_seconds:
        ids, lengths = packed[calls % len(packed)]
        launched = engine.submit(ids, lengths)
        if pending is not None:
            pending()
        pending, calls, sequences = launched, calls + 1, sequences + len(lengths)
    pending()
    return {"calls": calls, "seq_per_s": sequences / (time.perf_counter() - started), "max_abs_diff": diff}


def run_variants(model_dir, device, base_opts, results, save, budget_end) -> None:
    sets = {bs: batches_for(bs, seed=7)[: (8 if bs >= 128 else 32)] for bs in (1, 128, 1024)}
    ref_batch = sets[128][0]
    base_out = None
    for name, opts in VARIANTS:
        if time.time() > budget_end:
            results["variants"].append({"name": name, "options": opts, "skipped": "time budget"})
            continue
        row = {"name": name, "options": opts}
        print(f"[variant] {name} ...", flush=True)
        try:
            t0 = time.time()
            eng = load_engine("torch", model_dir, device, {**base_opts, **opts})
            row["resolved"] = {"attention": eng.ops.attention, "kernels": eng.ops.kernels, "gelu": eng.ops.gelu}
            out = eng.forward(ref_batch)
            row["first_call_s"] = time.time() - t0
            if base_out is None:
                base_out = out
            row["cos_vs_default_min"] = float(cosine(out, base_out).min())
            for bs, batches in sets.items():
                r = time_calls(eng.forward, batches, min_calls=(200 if bs == 1 else 16), min_seconds=0.3)
                row[f"bs{bs}"] = r
            row["graphs"] = len(getattr(eng, "_graphs", {}))
            print(
                f"[variant] {name}: bs1 p50 {row['bs1']['p50_ms']:.3f} ms, bs128 {row['bs128']['seq_per_s']:.0f} seq/s,"
                f" bs1024 {row['bs1024']['seq_per_s']:.0f} seq/s, cos {row['cos_vs_default_min']:.5f}",
                flush=True,
            )
            del eng
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"[variant] {name} failed: {row['error']}", flush=True)
            traceback.print_exc()
        results["variants"].append(row)
        gc.collect()
        torch.cuda.empty_cache()
        save()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    ap.add_argument("--variants", action="store_true", help="also time the engine variants (attention, kernels...)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--profile", action="store_true", help="kernel time by kind at the largest batch (eager)")
    ap.add_argument("--diagnose", action="store_true", help="host/GPU time split of one largest-batch call")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip remaining variants past this many seconds")
    ap.add_argument("--option", action="append", default=[], help="engine option key=value (repeatable)")
    ap.add_argument(
        "--idle-gaps-ms", default="", help="batch-1 latency with the host idle this long between calls (e.g. 0,2)"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("engine_bench needs a CUDA device", file=sys.stderr)
        return 2
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    base_opts = {"precision": args.precision}
    for kv in args.option:
        k, v = kv.split("=", 1)
        base_opts[k] = v
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    lens = draw_lengths(np.random.default_rng(1234), 100_000)
    results: dict = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "model": "BERT-base (BertConfig() sizes), random weights, mean pooling + L2 normalize",
        "lengths": {
            "law": f"clip(round(lognormal(ln({MEAN_LEN}) - {SIGMA}^2/2, {SIGMA})), 8, 128), numpy default_rng",
            "mean": float(lens.mean()),
            "p50": float(np.percentile(lens, 50)),
            "p99": float(np.percentile(lens, 99)),
        },
        "engine_options": base_opts,
        "engine": {},
        "baseline_transformers_fp16": {},
        "variants": [],
    }
    try:
        import triton

        results["triton"] = triton.__version__
    except Exception:
        results["triton"] = None
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except Exception:
        results["transformers"] = None
    out_file = args.out / "engine_bench.json"

    def save():
        out_file.write_text(json.dumps(results, indent=2) + "\n")

    tmp = Path(tempfile.mkdtemp(prefix="bert_base_"))
    model_dir = write_bert_base(tmp / "model")
    spin_up(device)
    print(f"lengths: mean {results['lengths']['mean']:.1f}, p50 {results['lengths']['p50']:.0f}", flush=True)

    # --- engine -------------------------------------------------------------------------------------------
    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.time()
    engine = load_engine("torch", model_dir, args.device, base_opts)
    results["engine_load_s"] = time.time() - t0
    ops = engine.ops
    results["engine_resolved"] = {"attention": ops.attention, "kernels": ops.kernels, "gelu": ops.gelu}
    print(f"engine: {results['engine_resolved']} loaded in {results['engine_load_s']:.1f}s", flush=True)
    batch_sets = {bs: batches_for(bs, seed=0) for bs in batch_sizes}
    for bs in batch_sizes:
        t0 = time.time()
        r = time_calls(engine.forward, batch_sets[bs], min_calls=(300 if bs <= 8 else 24), min_seconds=0.5)
        r["wall_s_incl_capture"] = time.time() - t0
        results["engine"][str(bs)] = r
        print(
            f"engine bs={bs}: {r['seq_per_s']:.0f} seq/s, p50 {r['p50_ms']:.3f}, p99 {r['p99_ms']:.3f} ms", flush=True
        )
        save()
    for bs in batch_sizes:  # two in flight: the next launched before the last is collected
        r = time_pipelined(engine, batch_sets[bs])
        results.setdefault("engine_pipelined", {})[str(bs)] = r
        print(f"engine pipelined bs={bs}: {r['seq_per_s']:.0f} seq/s, max diff {r['max_abs_diff']:.2e}", flush=True)
        save()
    for gap_ms in (float(g) for g in args.idle_gaps_ms.split(",") if g):
        # What a lone request sees: the host (and GPU) idle between calls, as at concurrency 1 in a server.
        lat = []
        for b in batch_sets.get(1) or batches_for(1, seed=0):
            time.sleep(gap_ms / 1e3)
            t0 = time.perf_counter()
            engine.forward(b)
            lat.append((time.perf_counter() - t0) * 1e3)
        results.setdefault("idle_gap_batch1", {})[str(gap_ms)] = {
            "calls": len(lat), "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))
        }  # fmt: skip
        print(f"engine bs=1 after {gap_ms} ms idle: p50 {np.percentile(lat, 50):.3f} ms", flush=True)
    results["engine_memory"] = memory_peak(device)
    results["engine_graphs"] = len(engine._graphs)
    # Host-side packing alone (numpy into the pinned buffer) at the largest batch.
    big, blens = pack_sequences(batch_sets[max(batch_sizes)][0])
    bucket = token_bucket(int(blens.sum()), engine.buckets_per_octave)
    size = layout_size(bucket, len(blens), engine.tile_block)
    buf = np.empty(size, dtype=np.int32)
    t0 = time.perf_counter()
    for _ in range(20):
        pack(buf, big, blens, bucket, len(blens), engine.tile_block)
    results["host_pack_ms_largest_batch"] = (time.perf_counter() - t0) / 20 * 1e3
    save()

    # --- numerics: fp16 engine vs fp32 transformers on a bench batch ---------------------------------------
    check = batch_sets[128][0] if 128 in batch_sets else batch_sets[batch_sizes[-1]][0]
    engine_out = engine.forward(check)
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    try:
        ref32 = HFBaseline(model_dir, args.device, torch.float32)
        ref = ref32(check)
        cos = cosine(engine_out, ref)
        mean = ref.mean(0, keepdims=True)
        results["numerics"] = {
            "batch": len(check),
            "engine_vs_transformers_fp32_cos_min": float(cos.min()),
            # random-init BERT gives near-parallel embeddings: the cosine after removing the mean row is stricter
            "engine_vs_transformers_fp32_centered_cos_min": float(cosine(engine_out - mean, ref - mean).min()),
            "engine_vs_transformers_fp32_cos_mean": float(cos.mean()),
            "engine_vs_transformers_fp32_max_abs": float(np.abs(engine_out - ref).max()),
        }
        del ref32
    except Exception as exc:
        results["numerics"] = {"error": f"{type(exc).__name__}: {exc}"}
    gc.collect()
    torch.cuda.empty_cache()
    save()

    # --- transformers fp16 baseline ------------------------------------------------------------------------
    if not args.no_baseline:
        try:
            torch.cuda.reset_peak_memory_stats(device)
            base = HFBaseline(model_dir, args.device, torch.float16)
            base_out = base(check)
            if "numerics" in results and "error" not in results["numerics"]:
                results["numerics"]["transformers_fp16_vs_fp32_cos_min"] = float(cosine(base_out, ref).min())
            for bs in batch_sizes:
                r = time_calls(base, batch_sets[bs], min_calls=(100 if bs <= 8 else 8), min_seconds=0.3)
                results["baseline_transformers_fp16"][str(bs)] = r
                print(f"transformers bs={bs}: {r['seq_per_s']:.0f} seq/s, p50 {r['p50_ms']:.3f} ms", flush=True)
                save()
            results["baseline_memory"] = memory_peak(device)
            del base
        except Exception as exc:
            results["baseline_error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        gc.collect()
        torch.cuda.empty_cache()
        save()

    # --- kernel time by kind, host/GPU split ----------------------------------------------------------------
    big_batch = batch_sets[max(batch_sizes)][0]
    for flag, key, fn in (
        (args.profile, "profile", lambda: profile_engine(model_dir, args.device, base_opts, big_batch, args.out)),
        (args.diagnose, "diagnose", lambda: diagnose(model_dir, args.device, base_opts, big_batch)),
    ):
        if not flag:
            continue
        try:
            results[key] = fn()
            print(f"{key}: {json.dumps(results[key])}", flush=True)
        except Exception as exc:
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        gc.collect()
        torch.cuda.empty_cache()
        save()

    # --- variants ------------------------------------------------------------------------------------------
    if args.variants:
        run_variants(model_dir, args.device, base_opts, results, save, started + args.budget_s)

    results["total_s"] = time.time() - started
    save()
    print_table(results)
    return 0


def print_table(results: dict) -> None:
    if results["variants"]:
        print("\nvariants (bs1 p50 ms | bs128 seq/s | bs1024 seq/s | min cos vs default):")
        for v in results["variants"]:
            if "bs1024" in v:
                print(
                    f"  {v['name']:<34} {v['bs1']['p50_ms']:7.3f} | {v['bs128']['seq_per_s']:9.0f} |"
                    f" {v['bs1024']['seq_per_s']:9.0f} | {v['cos_vs_default_min']:.5f}"
                )
            else:
                print(f"  {v['name']:<34} {v.get('error') or v.get('skipped')}")
    num = results.get("numerics", {})
    print(f"\nnumerics: {json.dumps(num)}")
    print(f"memory: engine {results.get('engine_memory')}, transformers {results.get('baseline_memory')}")
    mean_len = results["lengths"]["mean"]
    print(f"{results['gpu']}, torch {results['torch']}, {results['date']}; lengths mean {mean_len:.1f}")
    head = f"{'batch':>6} | {'engine seq/s':>12} {'p50 ms':>8} {'p99 ms':>8} | {'HF fp16 seq/s':>13} {'p50 ms':>8}"
    print(head + " | speedup")
    for bs, r in results["engine"].items():
        b = results["baseline_transformers_fp16"].get(bs)
        base = f"{b['seq_per_s']:13.0f} {b['p50_ms']:8.3f} | {r['seq_per_s'] / b['seq_per_s']:6.2f}x" if b else "-"
        print(f"{bs:>6} | {r['seq_per_s']:12.0f} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} | {base}")


if __name__ == "__main__":
    sys.exit(main())
