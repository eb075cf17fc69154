"""python -m bench.int8_ranking: whether the API front's integer embeddings rank sentence pairs as its floats do.

    python -m bench.int8_ranking --out DIR [--settings FILE] [--set SECTION.KEY=VALUE] [--held-out 300]
                                 [--dimensions 128 64 32]

Generates the repository from the settings' export (`make export`, with its calibration.npy), starts the real
launcher on free ports and embeds real texts through its API front, at the full width and at each --dimensions
(Matryoshka: cut and renormalized): POST /v1/embeddings once per encoding_format (float, int8, uint8,
int8_calibrated, uint8_calibrated) and Cohere's POST /v2/embed for int8. Every pair of texts is scored by dot
product and by cosine; each form's Spearman against the floats' is recorded:
- served: int8 (both routes), uint8 less 128 (what a uint8 user ranks) and as it comes, the _calibrated forms as
  they come and int8_calibrated dequantized to its buckets' middles by the calibration's ranges;
- sentence-transformers' `quantize_embeddings` of the served floats: int8 with calibration_embeddings (the export's
  calibration cut alike; its bytes must equal int8_calibrated's) and int8 with no calibration (the texts' own
  ranges, what the library does when given none);
- the symmetric int8 schemes not chosen, of the served floats: a scale per row (127 over the row's largest
  |value|) and one scale from the calibration's 99.9th percentile |value| instead of its largest (clipped).
Two text sets: the export's validation sentences (in the calibration corpus) and --held-out lines of the shipped
corpus the calibration did not pick. Writes DIR/int8_ranking.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
from sentence_transformers.util.quantization import quantize_embeddings

from bench.record import header, write
from export.calibration import SHIPPED_CORPUS, corpus_texts
from export.onnx_export import VALIDATION_SENTENCES
from model_repository.generate import generate
from protocol.api_key import api_key, headers
from serving.api.quantization import Calibration, symmetric_scale
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_settings

FORMATS = ("float", "int8", "uint8", "int8_calibrated", "uint8_calibrated")
QUIET = ["server.canary_interval_s=0"]


def pair_similarities(rows) -> tuple[np.ndarray, np.ndarray]:
    """Every pair's (i < j) dot product and cosine, in float64 (integer rows' dot products are exact)."""
    rows = np.asarray(rows, dtype=np.float64)
    dots = rows @ rows.T
    norms = np.linalg.norm(rows, axis=1)
    upper = np.triu_indices(len(rows), 1)
    return dots[upper], (dots / np.maximum(np.outer(norms, norms), 1e-12))[upper]


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (integer rows' dot products tie)."""
    order = np.argsort(values, kind="stable")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranked = np.empty(len(values))
    ranked[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranked


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def agreement(rows, floats) -> dict[str, float]:
    """Spearman of the rows' pair dot products and cosines against the float rows' own."""
    found, reference = pair_similarities(rows), pair_similarities(floats)
    return {
        "dot": round(spearman(found[0], reference[0]), 4),
        "cosine": round(spearman(found[1], reference[1]), 4),
    }


def other_schemes(floats: np.ndarray, calibration_rows: np.ndarray) -> dict[str, dict[str, float]]:
    """The symmetric int8 not served: a scale per row, and a scale that clips the calibration's top 0.1 %."""
    per_row = np.rint(floats * (127 / np.abs(floats).max(axis=1, keepdims=True)))
    percentile = np.clip(np.rint(floats * (127 / np.quantile(np.abs(calibration_rows), 0.999))), -127, 127)
    return {"other_int8_scale_per_row": agreement(per_row, floats), "other_int8_p99.9": agreement(percentile, floats)}


def held_out_texts(count: int) -> list[str]:
    """`count` lines of the shipped corpus that the calibration did not pick, evenly spread."""
    picked = set(corpus_texts())
    lines = [line for path in SHIPPED_CORPUS for line in path.read_text().splitlines() if line.strip()]
    unpicked = [line for line in dict.fromkeys(lines) if line not in picked]
    return [unpicked[i] for i in np.linspace(0, len(unpicked) - 1, count).round().astype(int)]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers(api_key())}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def measure(api_url: str, model: str, texts: list[str], width: int, calibration: Calibration, full: int) -> dict:
    """One text set at one width: every form's agreement with the served floats."""
    cut = {} if width == full else {"dimensions": width}
    served = {}
    for encoding in FORMATS:
        body = {"model": model, "input": texts, "encoding_format": encoding, **cut}
        data = sorted(post(f"{api_url}/v1/embeddings", body)["data"], key=lambda item: item["index"])
        served[encoding] = np.array([item["embedding"] for item in data])
    cohere = {
        "model": model,
        "texts": texts,
        "embedding_types": ["int8"],
        **({"output_dimension": width} if cut else {}),
    }
    cohere_int8 = np.array(post(f"{api_url}/v2/embed", cohere)["embeddings"]["int8"])
    floats = served["float"].astype(np.float32)
    ranges = calibration.ranges(width)
    calibration_rows = calibration.embeddings[:, :width]
    calibration_rows = calibration_rows / np.linalg.norm(calibration_rows, axis=1, keepdims=True)
    library = quantize_embeddings(floats, "int8", calibration_embeddings=calibration_rows)
    steps = (ranges[1] - ranges[0]) / 255
    dequantized = ranges[0] + (served["int8_calibrated"] + 128 + 0.5) * steps
    return {
        "texts": len(texts),
        "pairs": len(texts) * (len(texts) - 1) // 2,
        "int8_scale": round(float(symmetric_scale(ranges)), 2),
        "int8_mean_abs": round(float(np.abs(served["int8"]).mean()), 1),  # the resolution a value keeps
        "int8_at_127_share": float(np.mean(np.abs(served["int8"]) == 127)),  # clipped, or the calibration's largest
        "cohere_int8_equals_openai_int8": bool(np.array_equal(cohere_int8, served["int8"])),
        "library_int8_equals_int8_calibrated": bool(np.array_equal(library, served["int8_calibrated"])),
        "spearman": {
            "int8": agreement(served["int8"], floats),
            "cohere_v2_int8": agreement(cohere_int8, floats),
            "uint8_less_128": agreement(served["uint8"] - 128, floats),
            "uint8_as_served": agreement(served["uint8"], floats),
            "int8_calibrated": agreement(served["int8_calibrated"], floats),
            "uint8_calibrated": agreement(served["uint8_calibrated"], floats),
            "int8_calibrated_dequantized": agreement(dequantized, floats),
            "library_int8_calibration_embeddings": agreement(library, floats),
            "library_int8_no_calibration": agreement(quantize_embeddings(floats, "int8"), floats),
            **other_schemes(floats, calibration_rows),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_ranking", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--settings", type=Path, help="default: settings/defaults.toml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a settings override")
    parser.add_argument("--held-out", type=int, default=300, help="corpus lines outside the calibration")
    parser.add_argument("--dimensions", type=int, nargs="*", default=[128, 64, 32], help="widths besides the full")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = load_settings(args.settings, [*args.set, *QUIET])
    calibration = Calibration.load(settings.export_dir)
    if calibration is None:
        raise SystemExit(f"{settings.export_dir} holds no calibration: export the model again")
    full = calibration.embeddings.shape[1]
    text_sets = {
        "validation_sentences": [line for line in VALIDATION_SENTENCES.read_text().splitlines() if line.strip()],
        "held_out_corpus": held_out_texts(args.held_out),
    }
    work = Path(tempfile.mkdtemp(prefix="int8_ranking-"))
    repository = generate(settings, settings.export_dir, work / "repository")
    ports = Ports.free()
    launcher = Launcher(args.settings or settings.path, repository, ports, work / "launcher.log", [*args.set, *QUIET])
    results: dict = {}
    try:
        launcher.start()
        api_url = f"http://127.0.0.1:{ports.api}"
        for name, texts in text_sets.items():
            for width in (full, *args.dimensions):
                results[f"{name}/{width}"] = found = measure(
                    api_url, settings.model.name, texts, width, calibration, full
                )
                print(name, width, json.dumps(found["spearman"]), flush=True)
    finally:
        launcher.terminate()
        launcher.process.wait(timeout=120)
    record = {
        **header("int8_ranking", argv),
        "model": settings.model.name,
        "engine": settings.engine_choice().describe(),
        "calibration_texts": len(calibration.embeddings),
        "results": results,
    }
    write(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
