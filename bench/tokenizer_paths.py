"""python -m bench.tokenizer_paths: what tokenizing a text costs on each of the stage's paths, per tokenizer family.

For each family (export/tokenizer_training.py: a vocabulary of --vocab-size learned from loadtest/corpus.txt
and export/multilingual_sentences.txt; the SentencePiece layouts, xlm-roberta-spm and the others, with XLM-R's
nmt_nfkc character map as real checkpoints ship it) the corpus is tokenized in batches of --batch texts,
truncated to --max-tokens, on one core (the process pinned to it, the Rust tokenizer's thread pool off), by:
- `hugging_face`: the Rust tokenizer's encode_batch, what a text takes without the ASCII fast path (every text
  of every tokenizer but BERT's WordPiece took it before the fast paths for byte-level BPE and Unigram);
- `stage`: TextTokenizer.encode, as the stages call it (the ASCII fast path where the tokenizer has one);
and the corpus as (query, text) pairs by `hugging_face_pairs` and `stage_pairs` (encode_pairs). Per path the
CPU microseconds per text (or pair): the best of --repeat passes after one that fills the word caches, and that
first pass alone. Also per family: `load_ms`, what building the stage's TextTokenizer takes (the stage does
at every start), and `megabyte_ms`, one text of a megabyte of the multilingual sentences (not ASCII) by each
(the stage reads a long text from a prefix where it can). Writes tokenizer_paths.json into --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.record import header, write
from common.hf_tokenizer import load_tokenizer
from export.tokenizer_training import (
    LAYOUTS,
    MULTILINGUAL_SENTENCES,
    SENTENCEPIECE_LAYOUTS,
    save_tokenizer,
    train_sentencepiece_tokenizer,
    train_tokenizer,
)
from loadtest.corpus import load_text
from model_repository.stages.text_tokenizer import TextTokenizer


def per_item_us(run: Callable[[list], object], items: list, batch: int, repeat: int) -> tuple[float, float]:
    """(best of `repeat` passes, the first pass): CPU microseconds per item of run() over items in batches. CPU
    time, not wall time: the process runs on one thread, and other work on the machine does not count."""
    passes = []
    for _ in range(repeat + 1):
        started = time.process_time()
        for start in range(0, len(items), batch):
            run(items[start : start + batch])
        passes.append((time.process_time() - started) / len(items) * 1e6)
    return min(passes[1:]), passes[0]


def best_ms(run: Callable[[], object], repeat: int) -> float:
    """The least CPU milliseconds of `repeat` runs."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append((time.process_time() - started) * 1e3)
    return min(times)


def measure(family: str, folder: Path, texts: list[str], args: argparse.Namespace) -> dict:
    vocabulary = MULTILINGUAL_SENTENCES.read_text().splitlines()
    path = folder / family / "tokenizer.json"
    if family in SENTENCEPIECE_LAYOUTS:
        path.parent.mkdir()
        train_sentencepiece_tokenizer(family, texts + vocabulary, args.vocab_size).save(str(path))
    else:
        save_tokenizer(train_tokenizer(family, texts + vocabulary, args.vocab_size), family, path.parent)
    reference, stage = load_tokenizer(path, args.max_tokens), TextTokenizer.from_file(path, args.max_tokens)
    pairs = list(zip(texts[::2], texts[1::2], strict=False))
    runs = {
        "hugging_face": (reference.encode_batch, texts),
        "stage": (stage.encode, texts),
        "hugging_face_pairs": (reference.encode_batch, pairs),
        "stage_pairs": (lambda batch: stage.encode_pairs(*map(list, zip(*batch, strict=True))), pairs),
    }
    result = {"family": family, "path": stage.path, "us_per_text": {}, "first_pass_us_per_text": {}}
    for name, (run, items) in runs.items():
        best, first = per_item_us(run, items, args.batch, args.repeat)
        result["us_per_text"][name] = round(best, 2)
        result["first_pass_us_per_text"][name] = round(first, 2)
    result["load_ms"] = round(best_ms(lambda: TextTokenizer.from_file(path, args.max_tokens), args.repeat), 1)
    megabyte = [(" ".join(vocabulary) * (1 + (1 << 20) // len(" ".join(vocabulary))))[: 1 << 20]]
    result["megabyte_ms"] = {
        "hugging_face": round(best_ms(lambda: reference.encode_batch(megabyte), 3), 1),
        "stage": round(best_ms(lambda: stage.encode(megabyte), 3), 1),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tokenizer_paths", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tokenizer_paths.json")
    families = [*LAYOUTS, *SENTENCEPIECE_LAYOUTS]
    parser.add_argument("--families", nargs="+", choices=families, default=families)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="texts per call, as a dynamic batch holds them")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    args.out.mkdir(parents=True, exist_ok=True)
    texts = load_text()
    record = header("tokenizer_paths", argv) | {
        "cores": 1,
        "texts": len(texts),
        "vocab_size": args.vocab_size,
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "families": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        for family in args.families:
            result = measure(family, Path(folder), texts, args)
            record["families"].append(result)
            costs = "  ".join(f"{name} {us:.1f}" for name, us in result["us_per_text"].items())
            megabyte = "  ".join(f"{name} {ms:.0f}" for name, ms in result["megabyte_ms"].items())
            print(f"{family:20} us/text: {costs}\n{'':20} load {result['load_ms']} ms; a megabyte, ms: {megabyte}")
            print(f"{'':20} {result['path']}", flush=True)
    write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
