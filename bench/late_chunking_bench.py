"""Late chunking on a long-context embedder: each document in one pass, pooled per chunk (the torch engine's
pool_spans), against the same documents embedded whole (forward_packed), on the same export, in one process.

    python -m bench.late_chunking_bench --device cpu|cuda --out DIR [--preset modernbert-base] [--tokens 8192]
                                        [--chunk 256] [--documents 8] [--batch 2] [--passes 3] [--threads N]

Model: random weights of the preset's real shape, exported as an embedder by the project's export
(settings/variants/modernbert.toml's source: 8,192 positions, local and global attention). Documents: corpus texts
joined until each has --tokens tokens. Per runner: documents/s and tokens/s, best of --passes after an untimed one.
agreement: the first document's chunks against transformers' fp32 last hidden states of the whole document (on the
same device) pooled per chunk: the least cosine. Writes DIR/late_chunking_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from bench.record import write
from bench.reference_run import PeakGrowth, add_run_arguments, measure, run_record, split
from export.__main__ import export
from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from model_repository.stages.engines.base import pack_sequences
from model_repository.stages.late_chunking import LateChunking
from settings import ROOT, load_settings

SETTINGS = ROOT / "settings" / "variants" / "modernbert.toml"


def documents(tokenizer_file: Path, count: int, tokens: int) -> list[np.ndarray]:
    """count documents of `tokens` token ids each ([CLS] ... [SEP]): the corpus's text, its ids repeated as needed."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_truncation()
    first, last = tokenizer.encode("").ids  # the special tokens around a text
    own = np.resize(
        np.array(tokenizer.encode(" ".join(load_text()), add_special_tokens=False).ids), count * (tokens - 2)
    )
    return [np.array([first, *part, last], np.int32) for part in own.reshape(count, tokens - 2)]


@torch.inference_mode()
def agreement(folder: Path, document: np.ndarray, chunks: np.ndarray, size: int, device: str) -> float:
    """The least cosine of the engine's chunks to transformers' fp32 states of the whole document pooled alike."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa").to(device).eval()
    states = model(input_ids=torch.from_numpy(document[None].astype(np.int64)).to(device)).last_hidden_state[0, 1:-1]
    expected = torch.stack([states[first : first + size].mean(0) for first in range(0, len(states), size)])
    expected = torch.nn.functional.normalize(expected.float(), dim=1).cpu().numpy()
    return float(((chunks / np.linalg.norm(chunks, axis=1, keepdims=True)) * expected).sum(1).min())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.late_chunking_bench", description=__doc__)
    add_run_arguments(parser, "2")
    parser.add_argument("--preset", default="modernbert-base")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens a document")
    parser.add_argument("--chunk", type=int, default=256, help="tokens a chunk")
    parser.add_argument("--documents", type=int, default=8)
    args = parser.parse_args(argv)
    size, batch = args.chunk, int(args.batch)
    memory = PeakGrowth(args.device)
    record = run_record("late_chunking_bench", argv, args, memory)
    record |= {"preset": args.preset, "tokens": args.tokens, "chunk": size, "documents": args.documents}
    with tempfile.TemporaryDirectory(prefix="late_chunking_bench_") as work:
        folder = Path(work) / "export"
        settings = load_settings(SETTINGS)
        export(f"random-init:{args.preset}", "embedding", args.tokens, folder, settings.engine.onnx_opset,
               settings.engine.onnx_tolerance, args.tokenizer, onnx=False)  # fmt: skip
        docs = documents(folder / "tokenizer.json", args.documents, args.tokens)
        options = {"precision": record["precision"], "threads": args.threads, **settings.engine.options}
        engine = load_engine("torch", folder, args.device, options)
        late = LateChunking(1, 1)

        def chunked(batch_docs: list[np.ndarray]) -> np.ndarray:
            ids, lengths = pack_sequences(batch_docs)
            bounds, _, kept = late.spans(lengths, size)
            return engine.pool_spans(ids, lengths, bounds)[kept]

        memory.loaded()
        runs = {"whole": engine.forward, "late_chunks": chunked}
        for name, call in runs.items():
            first, row = measure(call, split(docs, batch), args.passes, memory)
            row["tokens_per_s"] = row["texts_per_s"] * args.tokens
            record[name] = row
            if name == "late_chunks":
                first_chunks = first[: -(-(args.tokens - 2) // size)]
                record["agreement_min_cosine"] = agreement(folder, docs[0], first_chunks, size, args.device)
    record["late_vs_whole"] = record["late_chunks"]["texts_per_s"] / record["whole"]["texts_per_s"]
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    for name in runs:
        row = record[name]
        print(f"{name:<12} {row['texts_per_s']:>9.2f} documents/s {row['tokens_per_s']:>12,.0f} tokens/s "
              f"peak +{row['peak_growth_bytes'] / 2**20:,.0f} MiB")  # fmt: skip
    print(f"late / whole {record['late_vs_whole']:.3f}; agreement {record['agreement_min_cosine']:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
