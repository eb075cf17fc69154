"""python -m export: checkpoint -> build/models/<name>/ (model.onnx, weights, tokenizer, serving.json)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from common.contract import PROMPTS_FILE, TOKEN_TYPES, ServingSpec
from common.hf_tokenizer import load_tokenizer
from export import sha256
from export.calibration import write_calibration
from export.checkpoint import CheckpointError, Pooling, load_model, open_checkpoint, read_pooling, write_tokenizer
from export.hybrid_export import HybridStates, hybrid_spec, read_hybrid, save_heads, validate_hybrid
from export.multi_vector_export import MultiVectorStates, read_multi_vector, save_projection, validate_multi_vector
from export.onnx_export import VALIDATION_SENTENCES, ServingModule, export_onnx, validate
from export.sparse_export import SparseStates, save_head, sparse_activation, validate_sparse
from settings import ROOT, SettingsError, load_deployment
from settings.schema import TASKS

REPORT_FILE = "export_report.json"


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
) -> dict:
    """The checkpoint exported into out_dir, its ONNX model (unless onnx is false: the torch engine reads the
    weights alone) validated, an embedder's int8/uint8 ranges calibrated on calibration_corpus (None: the shipped
    texts); the report (export_report.json)."""
    started = time.perf_counter()
    checkpoint = open_checkpoint(source, tokenizer_json)
    if max_tokens > checkpoint.positions:
        raise CheckpointError(
            f"model.max_tokens is {max_tokens}, over the {checkpoint.positions} tokens a "
            f"{checkpoint.config.model_type} checkpoint's positions take: set model.max_tokens to at most that"
        )
    model = load_model(checkpoint, task)
    # A multi-vector checkpoint pools nothing: its modules are read by read_multi_vector. BGE-M3's dense vector is
    # its first token's, normalized, whatever modules.json says (BGEM3FlagModel's).
    pooling = {
        "multi_vector": Pooling("mean", normalize=False),
        "hybrid": Pooling("cls", normalize=True),
    }.get(task) or read_pooling(checkpoint.folder)
    has_modules = checkpoint.folder is not None and (checkpoint.folder / "modules.json").is_file()
    activation = sparse_activation(task, pooling, has_modules, checkpoint.config.model_type)
    config = model.config
    multi_vector = task == "multi_vector"
    if multi_vector:
        side_spec, projection = read_multi_vector(checkpoint, config.hidden_size, max_tokens)
    hybrid = task == "hybrid"
    if hybrid:
        heads = read_hybrid(checkpoint, config.hidden_size)
        side_spec, hybrid_fields = hybrid_spec(checkpoint, heads, max_tokens)
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
            "multi_vector": projection.weight.shape[0] if multi_vector else 0,
            "hybrid": config.hidden_size,
        }[task],
        labels=labels,
        max_tokens=max_tokens,
        pad_token_id=config.pad_token_id or 0,
        token_types=checkpoint.reads_token_types,
        activation=activation or "relu",
        multi_vector=side_spec.as_dict() if multi_vector or hybrid else None,
        hybrid=hybrid_fields if hybrid else None,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(checkpoint, out_dir, max_tokens, tokenizer_json)
    if checkpoint.folder is not None and (checkpoint.folder / PROMPTS_FILE).is_file():  # for TEI's prompt_name
        shutil.copyfile(checkpoint.folder / PROMPTS_FILE, out_dir / PROMPTS_FILE)
    spec.save(out_dir)
    if multi_vector:
        save_projection(projection, out_dir)
    if hybrid:
        save_heads(heads, out_dir)
    report = {"source": source, "model_type": config.model_type, "task": task}
    sparse = task == "sparse"
    if sparse:
        module = SparseStates(model)
    elif multi_vector:
        module = MultiVectorStates(model, projection)
    elif hybrid:
        module = HybridStates(model, heads)
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
    args = parser.parse_args(argv)
    try:
        deployment = load_deployment(args.settings)
        if len(deployment.models) > 1 and (args.source or args.random_init or args.task or args.out):
            raise SettingsError("--source, --random-init, --task and --out name one model: give one settings file")
        for settings in deployment.models:
            source = f"random-init:{args.random_init}" if args.random_init else args.source or settings.model.source
            report = export(
                source,
                args.task or settings.model.task,
                settings.model.max_tokens,
                args.out or settings.export_dir,
                settings.engine.onnx_opset,
                settings.engine.onnx_tolerance,
                args.tokenizer,
                onnx=settings.engine.kind != "torch",  # the torch engine reads config.json and the weights alone
                calibration_corpus=ROOT / corpus if (corpus := settings.model.calibration_corpus) else None,
            )
            print(json.dumps(report, indent=2))
    except (SettingsError, CheckpointError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
