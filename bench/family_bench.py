"""Engine-only benchmark of every architecture at its base size: the torch engine against transformers fp16 (SDPA;
MPNet, which has none in transformers, its own attention; padded batches) in the same call, and ModernBERT on
long sequences.

    python -m bench.family_bench --out DIR [--presets bert-base,roberta-base,...] [--batch-sizes 1,64,1024]
                                 [--long 2048,8192]

Models: each preset of model_repository/stages/engines/models (their real shapes: bert-base, roberta-base,
xlm-roberta-base, distilbert-base, mpnet-base, modernbert-base) built by transformers from the family's own
config class with random weights (seed 0), saved as Hugging Face saves them, with mean pooling and L2 normalize.
Lengths and timing are bench/engine_bench.py's (bench/engine_workload.py): lognormal lengths of mean 45 clipped
to 8-128, each timed call a list of host int32 arrays in and a host float32 array out. The transformers baseline
pads each batch to its longest sequence and pools the same way. --long: batches of sequences that long
(ModernBERT only; 8 sequences of 2,048, 2 of 8,192), tokens/s against transformers with its own attention (SDPA;
the sliding window as its mask). FLOPs per token (GEMMs and attention at the mean length) put the families side
by side. Writes DIR/family_bench.json after each model and prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.engine_workload import MEAN_LEN, cosine, draw_lengths, memory_peak, spin_up, time_calls
from common.contract import ServingSpec
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.models import presets

PRESETS = ("bert-base", "roberta-base", "xlm-roberta-base", "distilbert-base", "mpnet-base", "modernbert-base")
LONG_BATCH = {2048: 8, 8192: 2}  # sequences per call at each long length


def build(preset: str, folder: Path):
    """The preset's AutoModel with random weights, saved with its serving.json; returns its config."""
    import transformers

    fields = presets()[preset]
    config = transformers.AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config)
    model.save_pretrained(str(folder), safe_serialization=True)
    hidden = config.hidden_size
    ServingSpec("embedding", "mean", True, hidden, hidden, (), 8192, config.pad_token_id or 0).save(folder)
    del model
    return config


def flops_per_token(config, length: float) -> float:
    """Multiply-adds x 2 of one token: the layers' GEMMs and attention over `length` keys (a window caps it)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    inner = getattr(config, "intermediate_size", None) or config.hidden_dim
    glu = 3 if config.model_type == "modernbert" else 2  # GeGLU's input projection is twice as wide
    window = getattr(config, "local_attention", 0)
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    keys = [min(length, window + 1) if kind == "sliding_attention" else length for kind in types]
    return 2 * sum(4 * hidden * hidden + glu * hidden * inner + 2 * key * hidden for key in keys)


def batches(vocab: int, size: int, seed: int, length: int | None = None) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(1234 + size + seed)
    count = int(min(64, max(6, 8192 // size))) if length is None else 3
    out = []
    for _ in range(count):
        lengths = draw_lengths(rng, size) if length is None else np.full(size, length)
        out.append([rng.integers(5, min(vocab, 30000), size=int(n), dtype=np.int32) for n in lengths])
    return out


class Transformers:
    """transformers with SDPA (MPNet has none in transformers: its own attention), each batch padded to its longest
    sequence, pooled and normalized the same way."""

    def __init__(self, folder: Path, device: str, dtype=torch.float16) -> None:
        import transformers

        self.device = device
        try:
            model = transformers.AutoModel.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
        except ValueError:  # "does not support an attention implementation through ... scaled_dot_product_attention"
            model = transformers.AutoModel.from_pretrained(str(folder), dtype=dtype)
        self.model = model.to(device).eval()
        self.attention = model.config._attn_implementation

    @torch.inference_mode()
    def __call__(self, seqs: list[np.ndarray]) -> np.ndarray:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.model.config.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.from_numpy(s.astype(np.int64))
            mask[i, : len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        weights = mask[..., None].float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return torch.nn.functional.normalize(pooled, dim=1).cpu().numpy()


def measure(fn, sets: dict, fast: bool) -> dict:
    return {
        str(size): time_calls(fn, calls, min_calls=(200 if size == 1 else 16) if fast else 3, min_seconds=0.3)
        for size, calls in sets.items()
    }


def bench_preset(preset: str, args, work: Path) -> dict:
    folder = work / preset
    config = build(preset, folder)
    mean_len = float(draw_lengths(np.random.default_rng(0), 100_000).mean())
    row: dict = {
        "preset": preset,
        "model_type": config.model_type,
        "flops_per_token": flops_per_token(config, mean_len),
    }
    sets = {size: batches(config.vocab_size, size, seed=0) for size in args.batch_sizes}
    long = (
        {n: batches(config.vocab_size, LONG_BATCH[n], 1, n) for n in args.long}
        if config.model_type == "modernbert"
        else {}
    )
    torch.cuda.reset_peak_memory_stats()
    started = time.time()
    engine = load_engine("torch", folder, args.device, {"precision": "fp16"})
    row["engine_resolved"] = {"attention": engine.ops.attention, "kernels": engine.ops.kernels, "gelu": engine.ops.gelu}
    row["engine"] = measure(engine.forward, sets, True)
    row["engine_long"] = measure(engine.forward, long, False)
    row["engine_memory"] = memory_peak(args.device)
    row["engine_s"] = time.time() - started
    check = sets[max(sets)][0][:64] if sets else None
    engine_out = engine.forward(check) if check else None
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    baseline = Transformers(folder, args.device)
    row["transformers_attention"] = baseline.attention
    row["transformers_fp16"] = measure(baseline, sets, True)
    row["transformers_long"] = measure(baseline, long, False)
    del baseline
    gc.collect()
    torch.cuda.empty_cache()
    if check:  # the engine in fp16 against transformers in fp32 on the same batch
        reference = Transformers(folder, args.device, torch.float32)(check)
        mean = reference.mean(0, keepdims=True)
        row["centered_cosine_min_vs_fp32"] = float(cosine(engine_out - mean, reference - mean).min())
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.family_bench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--batch-sizes", default="1,64,1024")
    parser.add_argument("--long", default="2048,8192", help="ModernBERT's long sequence lengths ('' for none)")
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.long = [int(n) for n in args.long.split(",") if n]
    if not torch.cuda.is_available():
        print("family_bench needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    results = {
        "benchmark": "family_bench",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.family_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(args.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lengths": f"lognormal, mean {MEAN_LEN}, clipped to 8-128 (bench/engine_workload.py)",
        "models": [],
    }
    spin_up(torch.device(args.device))
    work = Path(tempfile.mkdtemp(prefix="family_bench_"))
    for preset in args.presets.split(","):
        print(f"[{preset}] ...", flush=True)
        try:
            results["models"].append(bench_preset(preset, args, work))
        except Exception as exc:  # one family failing must not hide the others' figures
            results["models"].append({"preset": preset, "error": f"{type(exc).__name__}: {exc}"})
        (args.out / "family_bench.json").write_text(json.dumps(results, indent=2) + "\n")
        print_row(results["models"][-1])
    return 0


def print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['preset']:<18} {row['error']}", flush=True)
        return
    cells = []
    for size, timing in row["engine"].items():
        base = row["transformers_fp16"][size]["seq_per_s"]
        cells.append(f"b{size} {timing['seq_per_s']:.0f}/{base:.0f} ({timing['seq_per_s'] / base:.2f}x)")
    for length, timing in row["engine_long"].items():
        base = row["transformers_long"][length]["tokens_per_s"]
        cells.append(f"L{length} {timing['tokens_per_s']:.0f}/{base:.0f} tok/s ({timing['tokens_per_s'] / base:.2f}x)")
    cos = row.get("centered_cosine_min_vs_fp32", float("nan"))
    gflops = row["flops_per_token"] / 1e9
    print(
        f"{row['preset']:<18} {gflops:.3f} GFLOP/token cos {cos:.5f} | seq/s engine/HF: " + "; ".join(cells), flush=True
    )


if __name__ == "__main__":
    raise SystemExit(main())
