"""python -m tests.golden.make_golden: regenerate minilm.npz, the stored golden inputs and outputs.

Inputs are the token ids of export/validation_sentences.txt (truncated to the default max_tokens);
outputs are sentence-transformers' fp32 embeddings of the same sentences on the CPU. Regenerate only
when the reference itself is meant to change, and say why in the commit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.hf_tokenizer import load_tokenizer
from export.__main__ import read
from export.checkpoint import resolve_source, tokenizer_file
from export.onnx_export import VALIDATION_SENTENCES
from settings import load_settings

GOLDEN = Path(__file__).with_name("minilm.npz")


def main() -> None:
    from sentence_transformers import SentenceTransformer

    settings = load_settings()
    sentences = VALIDATION_SENTENCES.read_text().splitlines()
    model = settings.model
    max_tokens = read(model.source, model.task, model.max_tokens).max_tokens  # the checkpoint's own, as exported
    tokenizer = load_tokenizer(tokenizer_file(model.source), max_tokens)
    ids = [np.array(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(sentences)]
    model = SentenceTransformer(str(resolve_source(settings.model.source)), device="cpu")
    embeddings = model.encode(sentences, batch_size=1, convert_to_numpy=True).astype(np.float32)
    lengths = np.array([len(x) for x in ids], dtype=np.int32)
    np.savez_compressed(GOLDEN, ids=np.concatenate(ids), lengths=lengths, embeddings=embeddings)
    print(f"wrote {GOLDEN}: {len(ids)} sequences, {lengths.sum()} tokens")


if __name__ == "__main__":
    main()
