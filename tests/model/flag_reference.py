"""FlagEmbedding's BGEM3FlagModel (M3Embedder), the reference for task hybrid, loaded without the package's
top-level imports: FlagEmbedding 1.4.2's __init__ imports every embedder and reranker, and its MiniCPM reranker
needs transformers.modeling_attn_mask_utils, which transformers 5 removed. The packages above the M3 modules are
entered as bare namespaces (their folders, none of their __init__ code); the M3 code runs unchanged."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

# The packages whose __init__ would import the rest of FlagEmbedding.
SKIPPED_INITS = ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder")


def m3_embedder(monkeypatch: pytest.MonkeyPatch):
    """FlagEmbedding.inference.embedder.encoder_only.m3.M3Embedder; skips the test when FlagEmbedding is absent."""
    spec = importlib.util.find_spec("FlagEmbedding")
    if spec is None or spec.origin is None:
        pytest.skip("FlagEmbedding is not installed (pip install flagembedding)")
    root = Path(spec.origin).parent
    for name in SKIPPED_INITS:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            monkeypatch.setitem(sys.modules, name, package)
    return importlib.import_module("FlagEmbedding.inference.embedder.encoder_only.m3").M3Embedder
