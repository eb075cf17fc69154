"""Hugging Face BERT checkpoint -> validated ONNX model plus what the serving stages need."""

import hashlib
from pathlib import Path


def sha256(path: Path) -> str:
    """Hex digest of a file, read in 1 MiB blocks (model files are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
