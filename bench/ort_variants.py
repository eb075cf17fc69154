"""python -m bench.ort_variants: ONNX Runtime variants of the exported model on this CPU, against the export as served.

Variants of build/models/<model>/model.onnx (the settings' export): `served` (as the onnxruntime_cpu engine loads
it: ORT_ENABLE_ALL, threads = cores), `fused` (ONNX Runtime's transformer optimizer for BERT: EmbedLayerNorm,
Attention, BiasGelu, SkipLayerNorm fusions) and `int8` (dynamic quantization of the weights to int8). Each
runs the first --texts corpus texts, sorted by length as the engine sorts a batch, in batches of each
--batch-sizes, twice in alternation; per variant and batch size: texts/s (the better of the two passes) and
the cosine of its embeddings to `served`'s (min and mean). Writes ort_variants.json. The question it answers
(issue 26, item 2): what ORT's own optimizations give on this CPU, and at what fidelity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model

from bench.record import header, write
from common.hf_tokenizer import load_tokenizer
from loadtest.corpus import load_text
from settings import load_settings


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def variants(model: Path, work: Path, heads: int, hidden: int) -> dict[str, Path]:
    fused, int8 = work / "fused.onnx", work / "int8.onnx"
    optimize_model(str(model), model_type="bert", num_heads=heads, hidden_size=hidden).save_model_to_file(str(fused))
    quantize_dynamic(
        str(model), str(int8), weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}
    )
    return {"served": model, "fused": fused, "int8": int8}


def feeds(tokenizer, texts: list[str], id_type) -> dict[str, np.ndarray]:
    encodings = tokenizer.encode_batch(texts)
    width = max(len(encoding.ids) for encoding in encodings)
    ids = np.zeros((len(texts), width), id_type)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(id_type)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ort_variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", help="settings file (default: settings/defaults.toml)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    settings = load_settings(args.settings)
    export = settings.export_dir
    config = onnx.load(str(export / "model.onnx"), load_external_data=False)
    args.out.mkdir(parents=True, exist_ok=True)
    model_config = json.loads((export / "config.json").read_text())
    paths = variants(export / "model.onnx", args.out, model_config["num_attention_heads"], model_config["hidden_size"])
    threads = settings.engine.threads or os.cpu_count() or 1
    sessions = {name: session(path, threads) for name, path in paths.items()}
    id_type = {6: np.int32, 7: np.int64}[config.graph.input[0].type.tensor_type.elem_type]  # the export's ids
    tokenizer = load_tokenizer(export / "tokenizer.json", settings.model.max_tokens)
    texts = sorted(load_text()[: args.texts], key=len)
    results: dict = {}
    for batch in args.batch_sizes:
        inputs = [feeds(tokenizer, texts[i : i + batch], id_type) for i in range(0, len(texts), batch)]
        rates: dict[str, float] = {}
        outputs: dict[str, np.ndarray] = {}
        for _ in range(2):
            for name, run in sessions.items():
                started = time.perf_counter()
                rows = np.concatenate([run.run(None, feed)[0] for feed in inputs])
                rates[name] = max(rates.get(name, 0.0), len(texts) / (time.perf_counter() - started))
                outputs[name] = rows
        served = outputs["served"]
        results[f"batch {batch}"] = {}
        for name, rows in outputs.items():
            cosine = (rows * served).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(served, axis=1)
            results[f"batch {batch}"][name] = {
                "texts_per_s": round(rates[name], 1),
                "vs_served": round(rates[name] / rates["served"], 3),
                "cosine_min": round(float(cosine.min()), 6),
                "cosine_mean": round(float(cosine.mean()), 6),
            }
        print(f"batch {batch}", results[f"batch {batch}"], flush=True)
    write(args.out, {**header("ort_variants", argv), "settings": str(settings.path), "threads": threads,
                     "results": results})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
