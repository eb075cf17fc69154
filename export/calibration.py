"""An embedder's int8/uint8 calibration, once at export: a corpus of real texts embedded by the PyTorch reference as
the API front serves them (pooled, unit length: OpenAI's and Cohere's routes normalize), written beside
serving.json as calibration.npy (float32 [texts, dim]). The API front takes each dimension's min and max over them
as the ranges (serving/api/quantization.py, Calibration), for the full width or for rows cut to `dimensions` and
renormalized, whose ranges are those of the calibration rows cut and renormalized alike: what
quantize_embeddings(embeddings, "int8", calibration_embeddings=...) computes.

The corpus is the settings' model.calibration_corpus (one text a line), else the sentences shipped here: the
export's validation sentences and the load test's corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common.contract import CALIBRATION_FILE
from common.hf_tokenizer import load_tokenizer
from common.padding import pad_sequences
from export.onnx_export import VALIDATION_SENTENCES
from settings import ROOT, SettingsError

SHIPPED_CORPUS = (VALIDATION_SENTENCES, ROOT / "loadtest" / "corpus.txt")
# Lines evenly spread over the corpus: the reference embeds ~40 texts a second on 2 cores (MiniLM), and 1,000 of
# the 4,030 shipped texts give ranges 10 % narrower than all of them, 0.14 % of the others' values clipped.
MAX_TEXTS = 1000
BATCH = 64  # texts per forward, sorted by length so that little is padding


def corpus_texts(corpus: Path | None = None) -> list[str]:
    """At most MAX_TEXTS non-empty lines, evenly spread over the corpus (the shipped one when None)."""
    lines = []
    for path in SHIPPED_CORPUS if corpus is None else (corpus,):
        try:
            lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"model.calibration_corpus: cannot read {path} ({exc})") from None
    if not lines:
        raise SettingsError(f"model.calibration_corpus: {corpus} holds no text")
    picked = np.unique(np.linspace(0, len(lines) - 1, min(len(lines), MAX_TEXTS)).round().astype(int))
    return [lines[i] for i in picked]


def unit_embeddings(module: Callable[..., torch.Tensor], sequences: list[np.ndarray], pad_id: int) -> np.ndarray:
    """The module's pooled rows, L2-normalized, in order of length (the ranges need no other order)."""
    rows = []
    with torch.inference_mode():
        for start in range(0, len(sequences), BATCH):
            ids, mask = pad_sequences(sequences[start : start + BATCH], pad_id)
            rows.append(F.normalize(module(torch.from_numpy(ids), torch.from_numpy(mask)), dim=1).numpy())
    return np.concatenate(rows)


def write_calibration(
    module: Callable[..., torch.Tensor], out_dir: Path, max_tokens: int, pad_id: int, corpus: Path | None
) -> dict:
    """calibration.npy in out_dir (whose tokenizer.json is the model's); what the export report says of it."""
    texts = corpus_texts(corpus)
    tokenizer = load_tokenizer(out_dir / "tokenizer.json", max_tokens)
    sequences = sorted((np.array(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)), key=len)
    np.save(out_dir / CALIBRATION_FILE, unit_embeddings(module, sequences, pad_id).astype(np.float32))
    paths = SHIPPED_CORPUS if corpus is None else (corpus,)
    sources = [str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path) for path in paths]
    return {"texts": len(texts), "corpus": sources}
