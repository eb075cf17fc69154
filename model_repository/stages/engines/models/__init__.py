"""The encoder architectures the torch engine runs, one module each, chosen by the checkpoint's config.json
`model_type` (TEI's candle backend and vLLM's model_executor/models/ are laid out the same way).

A module holds everything about its family: the config fields it reads, its weight names, its forward on the
packed token stream (built from torch_ops.TorchOps' blocks), its classification head, how many tokens its
positions take, whether it reads a pair's token types, and random-init presets of its real shapes. A new
family (DeBERTa-v2, NomicBERT) is a module with an `Encoder` subclass, its test, and a line in FAMILIES.
"""

from __future__ import annotations

import importlib

from .encoder import Encoder

# model_type (config.json) -> "module:class" of the Encoder that runs it.
FAMILIES = {
    "bert": "bert:BertEncoder",
    "roberta": "roberta:RobertaEncoder",
    "camembert": "roberta:RobertaEncoder",  # RoBERTa's architecture, its own name
    "xlm-roberta": "roberta:RobertaEncoder",
    "distilbert": "distilbert:DistilBertEncoder",
    "mpnet": "mpnet:MPNetEncoder",
    "modernbert": "modernbert:ModernBertEncoder",
}


class UnsupportedModel(ValueError):
    """A checkpoint of an architecture no module here runs."""


def architecture(model_type: str | None) -> type[Encoder]:
    """The Encoder class of this model_type; an unknown one is refused with the list of the supported ones."""
    entry = FAMILIES.get(model_type or "")
    if entry is None:
        raise UnsupportedModel(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(FAMILIES))}")
    module, name = entry.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def presets() -> dict[str, dict]:
    """Every family's random-init presets by name: config.json fields of its real shapes (model_type included)."""
    found: dict[str, dict] = {}
    for model_type in FAMILIES:
        found.update(architecture(model_type).presets)
    return found
