"""Task multi_vector (ColBERT): issue 34's tokens/s against PyLate, the engines as the stage runs them against
sentence-transformers' MultiVectorEncoder on the same texts, in one process.

    python -m bench.multi_vector_bench --device cpu|cuda --out DIR [--shape bert-base] [--batch 64,1] [--texts 1024]
                                       [--passes 3] [--threads N] [--tokenizer FILE] [--side document|query|both]

PyLate itself is not installable beside transformers 5; sentence-transformers' MultiVectorEncoder reads PyLate
checkpoints and is the reference this project tests against (tests/model/test_multi_vector.py), so it stands in.
Model: random weights of the preset's shape (bert-base: MiniLM's WordPiece vocabulary), exported as task
multi_vector by the project's export as settings/variants/colbert.toml's random-init source is (PyLate's defaults:
[Q] / [D] prompts, queries expanded with [MASK] to 32 tokens, string.punctuation skipped in documents, a random
projection to 128, normalized). The reference is a MultiVectorEncoder built from that same export: Transformer (the
export's folder with serving.json's expansion and lengths), Dense (projection.npz, Identity), MultiVectorMask (the
same skiplist words), Normalize, and serving.json's prompts; fp16 on CUDA, fp32 on the CPU.
Texts: loadtest/corpus.txt, as documents and (truncated and expanded as queries are) as queries. Runners, each
called once per batch of --batch texts: sentence_transformers (encode_document / encode_query, batch_size the
batch), the torch engine (fp16 on CUDA, fp32 on the CPU) and onnxruntime_cpu (CPU only), the engines loaded as the
stage loads them and called through the stage core (stage_core.py: tokenizing, the engine, the request's packed
fp16 token_vectors and token_counts), one request of the batch's texts a call. On CUDA, "torch in turns" answers
TURNS requests of the batch's texts in one call as a stub beside the query lane does (gpu_turns.py, a chunk of one
request a turn): the next chunk is tokenized while the engine runs this one.
Per side, runner and batch size: texts/s and kept token vectors/s (tokens_per_s) of the best of --passes timed
passes after an untimed one; the peak memory during them over what the runner held once loaded; the ratio to
sentence_transformers; and, on the first batch, the agreement with it (the same token count per text, the lowest
cosine of a token's vector to the reference's: at least 0.999 in fp16, 0.9999 in fp32).
Writes DIR/multi_vector_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import string
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.record import write
from bench.reference_run import (
    PeakGrowth,
    add_run_arguments,
    batch_sizes,
    load_runner,
    measure,
    run_record,
    runner_names,
    split,
)
from common.contract import INPUT_TYPE, PROJECTION_FILE
from common.gpu_board import GpuBoard
from common.multi_vector import MultiVectorSpec
from export.__main__ import export
from loadtest.corpus import load_text
from model_repository.stages.engines.models import presets
from model_repository.stages.gpu_turns import GpuTurns
from model_repository.stages.multi_vector_output import MultiVectorSides
from model_repository.stages.stage_core import HeldRequest, StageCore
from model_repository.stages.text_input import TextInput
from protocol.multi_vector import token_vectors
from settings import ROOT, Settings, load_settings

SETTINGS = ROOT / "settings" / "variants" / "colbert.toml"
SKIPLIST = list(string.punctuation)  # PyLate's, as the random-init export's (export/multi_vector_export.py)
MIN_COSINE = {"fp16": 0.999, "fp32": 0.9999}
SIDES = ("document", "query")
TURNS = 8  # requests a "torch in turns" call answers, one chunk each


def reference_encoder(folder: Path, spec: MultiVectorSpec, max_tokens: int, device: str):
    """A MultiVectorEncoder of the export's weights, projection, sides and prompts (fp16 on CUDA)."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from tokenizers import Tokenizer

    expansion = None
    if spec.expansion_id is not None:
        token = Tokenizer.from_file(str(folder / "tokenizer.json")).id_to_token(spec.expansion_id)
        expansion = {"strategy": spec.expansion_strategy, "attend": spec.expansion_attended,
                     "token": token, "length": spec.expansion_length}  # fmt: skip
    transformer = Transformer(str(folder), query_expansion=expansion, query_length=spec.query_max_tokens,
                              document_length=spec.document_max_tokens, max_seq_length=max_tokens)  # fmt: skip
    with np.load(folder / PROJECTION_FILE) as arrays:
        weight, bias, normalize = arrays["weight"], arrays.get("bias"), bool(arrays["normalize"])
    dense = Dense(weight.shape[1], weight.shape[0], bias=bias is not None, activation_function=torch.nn.Identity(),
                  init_weight=torch.from_numpy(weight), init_bias=None if bias is None else torch.from_numpy(bias),
                  module_input_name="token_embeddings")  # fmt: skip
    tasks = [side for side, skips in (("query", spec.skiplist_query), ("document", spec.skiplist_document)) if skips]
    modules = [transformer, dense, MultiVectorMask(SKIPLIST, skiplist_tasks=tasks or None)]
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    prompts = {"query": spec.query_prompt, "document": spec.document_prompt}
    model = MultiVectorEncoder(modules=modules, prompts={k: v for k, v in prompts.items() if v}, device=device)
    return model.half() if device == "cuda" else model


def stage_core(folder: Path, engine, settings: Settings) -> StageCore:
    """The stage core of the export, as a stub builds it from its config parameters (model_repository/configs.py)."""
    tokenizer = settings.tokenizer
    params = {"max_tokens": str(settings.model.max_tokens), "max_text_bytes": str(tokenizer.max_text_bytes),
              "max_request_bytes": str(tokenizer.max_request_bytes)}  # fmt: skip
    return StageCore(TextInput(folder, params, 1), engine, params, folder, lambda *_: None)


def held_request(texts: list[str], side: str) -> HeldRequest:
    column = np.array([[text.encode()] for text in texts], dtype=np.object_)
    return HeldRequest(column, None, json.dumps({INPUT_TYPE: side}))


def served_call(core: StageCore, side: str, turns: GpuTurns | None = None):
    """A batch of texts as the stage answers one request of them; with `turns`, TURNS batches' requests answered
    in one stage call, a chunk of one request a turn (the call's output is its first request's answer)."""

    def call(texts: list[str]) -> dict[str, np.ndarray]:
        if turns is None:
            (answer,) = core.answer([held_request(texts, side)])
        else:
            size = turns.chunk_texts
            answer, *_ = core.answer(
                [held_request(texts[i : i + size], side) for i in range(0, len(texts), size)], turns
            )
        assert not isinstance(answer, str), answer
        return answer

    return call


def agreement(served: list[np.ndarray], reference: list, precision: str) -> dict:
    """The same token count per text, and the lowest cosine of a token's vector to the reference's."""
    reference = [np.asarray(rows.float().cpu() if torch.is_tensor(rows) else rows, np.float32) for rows in reference]
    same = sum(len(a) == len(b) for a, b in zip(served, reference, strict=True))
    row = {"same_token_counts": f"{same}/{len(served)}", "min_cosine": float("nan")}
    if same == len(served):
        a, b = np.concatenate(served), np.concatenate(reference)
        row["min_cosine"] = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    row["ok"] = same == len(served) and row["min_cosine"] >= MIN_COSINE[precision]
    return row


def main(argv: list[str] | None = None) -> int:
    import sentence_transformers

    parser = argparse.ArgumentParser(prog="python -m bench.multi_vector_bench", description=__doc__)
    add_run_arguments(parser, None)
    parser.add_argument("--shape", choices=list(presets()), default="bert-base", help="random-init preset")
    parser.add_argument("--side", choices=(*SIDES, "both"), default="document", help="which side's texts")
    args = parser.parse_args(argv)
    sizes = batch_sizes(args)
    sides_run = list(SIDES) if args.side == "both" else [args.side]
    settings = load_settings(SETTINGS)
    torch.set_num_threads(args.threads)  # MultiVectorEncoder's; the engines set theirs from the options
    texts = [text for text in load_text() if text.strip()][: args.texts]
    memory = PeakGrowth(args.device)
    record = run_record("multi_vector_bench", argv, args, memory)
    record |= {"sentence_transformers": sentence_transformers.__version__, "shape": args.shape, "texts": len(texts)}
    max_tokens, precision = settings.model.max_tokens, record["precision"]
    with tempfile.TemporaryDirectory(prefix="multi_vector_bench_") as work:
        folder = Path(work) / "export"
        report = export(f"random-init:{args.shape}", "multi_vector", max_tokens, folder, settings.engine.onnx_opset,
                        settings.engine.onnx_tolerance, args.tokenizer, onnx=args.device == "cpu")  # fmt: skip
        raw_spec = json.loads((folder / "serving.json").read_text())["multi_vector"]
        sides = MultiVectorSides(folder / "tokenizer.json", raw_spec)
        record |= {"export_s": report["seconds"], "multi_vector": raw_spec, "sides": {}}
        for side in sides_run:
            _, lengths, _, kept = sides.encode(texts, side)
            record["sides"][side] = {
                "mean_tokens": float(lengths.mean()),
                "kept_tokens": int(kept.sum()),
                "batches": {str(size): {} for size in sizes},
            }
        reference = {}
        options = {"precision": precision, "threads": args.threads, **settings.engine.options}
        names = runner_names(args.device) + (["torch in turns"] if args.device == "cuda" else [])
        board = GpuBoard(Path(work) / "board")  # the turns' own: no lane holds queries on it
        for name in names:
            build = partial(reference_encoder, folder, sides.spec, max_tokens, args.device)
            model = load_runner(name.split()[0], build, folder, args.device, options)
            core = None if name == "sentence_transformers" else stage_core(folder, model, settings)
            memory.loaded()
            for side in sides_run:
                for size in sizes:
                    batches = split(texts, size)
                    if name == "sentence_transformers":
                        encode = model.encode_query if side == "query" else model.encode_document
                        call = partial(encode, batch_size=size, show_progress_bar=False, convert_to_numpy=True)
                    elif name == "torch in turns":  # a chunk of one request of `size` texts a turn
                        turns = GpuTurns(board, 0, False, size, 0, 0.0)
                        call, batches = served_call(core, side, turns), split(texts, size * TURNS)
                    else:
                        call = served_call(core, side)
                    first, row = measure(call, batches, args.passes, memory)
                    if name == "sentence_transformers":
                        reference[side, size] = first
                    else:
                        row["agreement"] = agreement(token_vectors(first, np.float32), reference[side, size], precision)
                    kept_tokens = record["sides"][side]["kept_tokens"]
                    row["tokens_per_s"] = row["texts_per_s"] * kept_tokens / len(texts)
                    record["sides"][side]["batches"][str(size)][name] = row
            del model, core, call
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        board.close()
    for side in record["sides"].values():
        for runs in side["batches"].values():
            base = runs["sentence_transformers"]["texts_per_s"]
            for row in runs.values():
                row["vs_sentence_transformers"] = row["texts_per_s"] / base
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, record)
    print_table(record)
    return 0


def print_table(record: dict) -> None:
    print(f"{'side':<8} {'batch':>5} {'runner':<22} {'texts/s':>9} {'tokens/s':>10} {'vs ST':>6} {'peak MiB':>9} "
          f"{'counts':>9} {'min cos':>8}")  # fmt: skip
    for side, runs_by_size in record["sides"].items():
        for size, runs in runs_by_size["batches"].items():
            for name, row in runs.items():
                check = row.get("agreement", {"same_token_counts": "-", "min_cosine": float("nan")})
                cells = (
                    f"{row['texts_per_s']:>9.1f} {row['tokens_per_s']:>10.0f} {row['vs_sentence_transformers']:>5.2f}x"
                )
                print(f"{side:<8} {size:>5} {name:<22} {cells} {row['peak_growth_bytes'] / 2**20:>9.1f} "
                      f"{check['same_token_counts']:>9} {check['min_cosine']:>8.6f}")  # fmt: skip
        print(f"{side:<8} mean tokens per text {runs_by_size['mean_tokens']:.1f}, kept {runs_by_size['kept_tokens']}")


if __name__ == "__main__":
    raise SystemExit(main())
