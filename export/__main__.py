"""python -m export: checkpoint -> build/models/<name>/ (model.onnx, weights, tokenizer, serving.json)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from common.contract import TOKEN_TYPES, ServingSpec
from common.hf_tokenizer import load_tokenizer
from export import sha256
from export.calibration import write_calibration
from export.checkpoint import CheckpointError, load_model, open_checkpoint, write_tokenizer
from export.explain import explain
from export.hybrid_export import HybridStates, read_hybrid, save_heads, validate_hybrid
from export.multi_vector_export import MultiVectorStates, read_multi_vector, save_projection, validate_multi_vector
from export.onnx_export import VALIDATION_SENTENCES, ServingModule, export_onnx, validate
from export.reading import Reading, read_checkpoint
from export.sparse_export import SparseStates, check_sparse_family, save_head, save_static_query, validate_sparse
from settings import ROOT, SettingsError, load_deployment
from settings.schema import TASKS

REPORT_FILE = "export_report.json"


def read(
    source: str,
    task: str,
    max_tokens: int,
    tokenizer_json: Path | None = None,
    pooling: str = "auto",
    normalize: str | bool = "auto",
) -> Reading:
    """What the export of `source` for `task` would serve and where each fact was read (--explain prints it);
    CheckpointError saying what to change where it cannot be served. max_tokens 0: the checkpoint's own limit."""
    checkpoint = open_checkpoint(source, tokenizer_json)
    if max_tokens > checkpoint.positions:
        raise CheckpointError(
            f"model.max_tokens is {max_tokens}, over the {checkpoint.positions} tokens a "
            f"{checkpoint.config.model_type} checkpoint's positions take: set model.max_tokens to at most that"
        )
    reading = read_checkpoint(checkpoint, task, max_tokens, pooling, normalize)
    check_sparse_family(task, checkpoint.config.model_type)
    if task == "multi_vector":
        read_multi_vector(reading)
    elif task == "hybrid":
        read_hybrid(reading)
    return reading


def export(
    source: str,
    task: str,
    max_tokens: int,
    out_dir: Path,
    opset: int,
    tolerance: float,
    tokenizer_json: Path | None = None,
    onnx: bool = True,
    calibration_corpus: Path | None = None,
    pooling: str = "auto",
    normalize: str | bool = "auto",
) -> dict:
    """The checkpoint exported into out_dir, its ONNX model (unless onnx is false: the torch engine reads the
    weights alone) validated, an embedder's int8/uint8 ranges calibrated on calibration_corpus (None: the shipped
    texts); the report (export_report.json). max_tokens 0: the checkpoint's own limit (read())."""
    started = time.perf_counter()
    reading = read(source, task, max_tokens, tokenizer_json, pooling, normalize)
    checkpoint, pooling, max_tokens = reading.checkpoint, reading.pooling, reading.max_tokens
    model = load_model(checkpoint, task)
    config = model.config
    activation = pooling.splade
    multi_vector = task == "multi_vector"
    hybrid = task == "hybrid"
    labels = tuple(config.id2label[i] for i in range(config.num_labels)) if task == "classification" else ()
    spec = ServingSpec(
        task=task,
        pooling="max" if activation else pooling.mode,
        normalize=pooling.normalize,
        hidden_size=config.hidden_size,
        output_size={
            "embedding": config.hidden_size,
            "classification": len(labels),
            "rerank": 1,
            "sparse": config.vocab_size,
            "multi_vector": reading.projection.weight.shape[0] if multi_vector else 0,
            "hybrid": config.hidden_size,
        }[task],
        labels=labels,
        max_tokens=max_tokens,
        pad_token_id=config.pad_token_id or 0,
        token_types=checkpoint.reads_token_types,
        activation=activation or "relu",
        multi_vector=reading.sides.as_dict() if multi_vector or hybrid else None,
        hybrid=reading.hybrid_fields if hybrid else None,
        prompts=reading.prompts,
        default_prompt_name=reading.default_prompt_name,
        max_active_dims=reading.max_active_dims,
        static_query=reading.static_query is not None,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(checkpoint, out_dir, max_tokens, tokenizer_json, reading.lowercase, tuple(reading.prefix_tokens))
    spec.save(out_dir)
    if multi_vector:
        save_projection(reading.projection, out_dir)
    if hybrid:
        save_heads(reading.heads, out_dir)
    if reading.static_query is not None:
        save_static_query(reading.static_query, out_dir)
    report = {"source": source, "model_type": config.model_type, "task": task}
    sparse = task == "sparse"
    if sparse:
        module = SparseStates(model)
    elif multi_vector:
        module = MultiVectorStates(model, reading.projection)
    elif hybrid:
        module = HybridStates(model, reading.heads)
    else:
        module = ServingModule(model, task, pooling, spec.token_types)
    module.eval()

    def finish() -> dict:
        """An embedder's calibration (the ranges the API front quantizes int8/uint8 by), once the export holds."""
        if task in ("embedding", "hybrid"):
            embed = module.dense if hybrid else module
            calibrated = write_calibration(embed, out_dir, max_tokens, spec.pad_token_id, calibration_corpus)
            report["calibration"] = calibrated
        report["seconds"] = round(time.perf_counter() - started, 1)
        (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        return report

    if not onnx:
        (out_dir / "model.onnx").unlink(missing_ok=True)  # an older export's would not match these weights
        return finish()

    partial = out_dir / "model.onnx.partial"
    export_onnx(module, partial, spec, opset)
    if sparse:
        save_head(model, out_dir)
    tokenizer = load_tokenizer(out_dir / "tokenizer.json", max_tokens)
    sentences = VALIDATION_SENTENCES.read_text().splitlines()
    # A reranker is validated on pairs: each sentence as the query of the next.
    inputs = list(zip(sentences, sentences[1:] + sentences[:1], strict=True)) if spec.pairs else sentences
    encodings = tokenizer.encode_batch(inputs)
    sequences = [np.array(e.ids, dtype=np.int32) for e in encodings]
    types = [np.array(e.type_ids, dtype=np.int32) for e in encodings] if TOKEN_TYPES in spec.engine_inputs else None
    if sparse:
        deviation = validate_sparse(model, partial, out_dir, sequences, spec)
    elif multi_vector:
        deviation = validate_multi_vector(module, partial, sequences, spec)
    elif hybrid:
        deviation = validate_hybrid(module, partial, sequences, spec)
    else:
        deviation = validate(module, partial, sequences, spec.pad_token_id, types)
    report |= {
        "opset": opset,
        "validation_sentences": len(sentences),
        "max_abs_diff_onnxruntime_vs_pytorch": deviation.max_abs_diff,
        "largest_output_magnitude": deviation.largest_output,
        "relative_diff_onnxruntime_vs_pytorch": deviation.relative,
        "tolerance": tolerance,
    }
    if deviation.relative > tolerance:
        partial.unlink()
        raise CheckpointError(
            f"ONNX Runtime differs from PyTorch by {deviation.max_abs_diff:.2e}, {deviation.relative:.2e} of the "
            f"largest output ({deviation.largest_output:.3g}) > tolerance {tolerance:.0e}: the exported graph does "
            "not compute what the checkpoint does"
        )
    onnx_path = partial.rename(out_dir / "model.onnx")
    report["onnx_sha256"] = sha256(onnx_path)
    return finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument(
        "--settings", nargs="+", default=[], help="settings file(s): each one's model (default: settings/defaults.toml)"
    )
    parser.add_argument("--source", help="override model.source: a folder, package:<name> or random-init:<preset>")
    parser.add_argument("--random-init", metavar="PRESET", help="shorthand for --source random-init:PRESET")
    parser.add_argument("--task", choices=TASKS, help="override model.task")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json to use instead of the checkpoint's own")
    parser.add_argument("--out", type=Path, help="output folder (default: the settings' export folder)")
    parser.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="SOURCE",
        help="export nothing: print what would be served and where each fact was read (SOURCE: as --source)",
    )
    args = parser.parse_args(argv)
    try:
        deployment = load_deployment(args.settings)
        if len(deployment.models) > 1 and (args.source or args.random_init or args.task or args.out):
            raise SettingsError("--source, --random-init, --task and --out name one model: give one settings file")
        for settings in deployment.models:
            source = f"random-init:{args.random_init}" if args.random_init else args.source or settings.model.source
            task = args.task or settings.model.task
            if args.explain is not None:
                source = args.explain or source
                try:
                    reading = read(source, task, settings.model.max_tokens, args.tokenizer, settings.model.pooling,
                                   settings.model.normalize)  # fmt: skip
                except CheckpointError as exc:
                    print(f"{source} would not be served as task {task}:\n  {exc}")
                    return 1
                print(explain(reading, settings))
                continue
            report = export(
                source,
                task,
                settings.model.max_tokens,
                args.out or settings.export_dir,
                settings.engine.onnx_opset,
                settings.engine.onnx_tolerance,
                args.tokenizer,
                onnx=settings.engine.kind != "torch",  # the torch engine reads config.json and the weights alone
                calibration_corpus=ROOT / corpus if (corpus := settings.model.calibration_corpus) else None,
                pooling=settings.model.pooling,
                normalize=settings.model.normalize,
            )
            print(json.dumps(report, indent=2))
    except (SettingsError, CheckpointError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
