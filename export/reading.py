"""What a checkpoint says about how it is to be served, each fact with where it was read: the export reads it before
any weight is loaded, and `python -m export --explain` prints it.

A sentence-transformers save says its pooling, normalization, prompts, lowercasing and token limit in its modules
(export/st_modules.py reads every release's layout); a CrossEncoder its head and score activation; a SparseEncoder
its SpladePooling and what its query side reads. A bare transformers checkpoint says only its family and head: its
pooling comes from the settings (model.pooling, model.normalize). Anything that would make the served numbers
differ from what the library computes is refused, naming the module, the key and the value, and what to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from export.checkpoint import Checkpoint, Pooling
from export.errors import CheckpointError
from export.st_modules import SETTINGS_FILE, TRANSFORMERS, Module, StCheckpoint, read_modules

POOLING_MODES = {  # what each release calls a pooling mode -> the engines' name
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "mean_sqrt_len": "mean_sqrt_len",
}
LEGACY_POOLING_KEYS = {  # Pooling's config before 6.0: one boolean per mode, in the order 6.x concatenates them
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
INERT = ("Dropout",)  # modules that compute nothing at inference
ENCODERS = {"SentenceTransformer": "embedding", "SparseEncoder": "sparse", "MultiVectorEncoder": "multi_vector"}
HUGE = 10**6  # a tokenizer_config model_max_length this large means "no limit" (transformers' VERY_LARGE_INTEGER)


@dataclass(frozen=True)
class Fact:
    value: object
    source: str  # where it was read: "1_Pooling/config.json: pooling_mode", "settings: model.task", ...


@dataclass
class Reading:
    """What the export of a checkpoint for a task serves, and where each fact came from (`facts`, in print order)."""

    checkpoint: Checkpoint
    task: str
    pooling: Pooling
    max_tokens: int
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    lowercase: bool = False
    max_active_dims: int = 0  # a SparseEncoder's cap on each vector's entries; 0: none
    static_query: Module | None = None  # an inference-free SparseEncoder's query side (SparseStaticEmbedding)
    # multi_vector and hybrid: what their readers add (export/multi_vector_export.py, export/hybrid_export.py)
    sides: object = None  # common.multi_vector.MultiVectorSpec
    projection: object = None  # a multi-vector model's Dense
    heads: object = None  # BGE-M3's sparse and colbert heads
    hybrid_fields: dict | None = None
    prefix_tokens: list[str] = field(default_factory=list)  # PyLate's prefixes, made special tokens of the tokenizer
    facts: dict[str, Fact] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what is served as set but differs from the library's default

    def add(self, name: str, value: object, source: str) -> None:
        self.facts[name] = Fact(value, source)


def _pooling_mode(saved: StCheckpoint, module: Module) -> tuple[str, str]:
    """A Pooling module's one mode and where it was read; refused unless it is one the engines pool by."""
    config = module.config
    if "pooling_mode" in config:
        key, value = "pooling_mode", config["pooling_mode"]
        modes = [value] if isinstance(value, str) else list(value)
    else:
        chosen = [name for name in LEGACY_POOLING_KEYS if config.get(name)]
        modes = [LEGACY_POOLING_KEYS[name] for name in chosen]
        key, value = " + ".join(chosen) or "pooling_mode_*", True
        if not modes:  # what 6.x reads such a config as
            modes, value = ["mean"], "none set (sentence-transformers pools mean)"
    where = saved.where(module, key)
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        served = ", ".join(sorted({*POOLING_MODES.values()}))
        raise CheckpointError(
            f"{where} = {value!r}: the engines pool one mode of {served}; a checkpoint pooled otherwise is not served"
        )
    return POOLING_MODES[modes[0]], where


def _key(saved: StCheckpoint, module: Module, key: str) -> str:
    """Where a key of a module's config was read, or that the release wrote none (its default holds)."""
    where = saved.where(module, key)
    return where if key in module.config else f"{where} (not written: the default)"


def _refuse(saved: StCheckpoint, module: Module, why: str) -> CheckpointError:
    return CheckpointError(f"sentence-transformers module {module.kind} ({saved.where(module)}) {why}")


def _embedder_modules(saved: StCheckpoint, reading: Reading) -> Pooling:
    """Transformer, Pooling, then Normalize: the one order that gives what the engines compute."""
    mode, mode_where, normalize, normalize_where = None, "", False, "modules.json: no Normalize module"
    for module in saved.modules:
        if module.kind in TRANSFORMERS or module.kind in INERT:
            if module.kind in TRANSFORMERS and mode is not None:
                raise _refuse(saved, module, "after the pooling is not served")
            continue
        if module.kind == "Pooling" and mode is None:
            mode, mode_where = _pooling_mode(saved, module)
            include = (module.config.get("include_prompt", True), _key(saved, module, "include_prompt"))
        elif module.kind == "Normalize" and mode is not None:
            normalize, normalize_where = True, f"modules.json: {saved.where(module)}"
        elif module.kind == "Dense":
            size = module.config.get("out_features")
            raise _refuse(saved, module, f"maps the pooled vector to out_features = {size}: not served")
        else:
            raise _refuse(saved, module, "is not served by the embedding task")
    if mode is None:
        raise CheckpointError("modules.json has no Pooling module: the checkpoint does not say how to pool")
    reading.add("pooling", mode, mode_where)
    reading.add("normalize", normalize, normalize_where)
    reading.add("include prompt", *include)
    return Pooling(mode, normalize)


def _settings_pooling(reading: Reading, pooling: str, normalize: str | bool, found: Pooling | None) -> Pooling:
    """model.pooling / model.normalize: what a bare checkpoint pools by; where the checkpoint says, they must agree."""
    if found is not None:
        if pooling not in ("auto", found.mode):
            where = reading.facts["pooling"].source
            raise CheckpointError(
                f'settings model.pooling = "{pooling}" but {where} says {found.mode}: set model.pooling = "auto"'
            )
        if normalize not in ("auto", found.normalize):
            where = reading.facts["normalize"].source
            raise CheckpointError(f'settings model.normalize = {normalize} but {where}: set model.normalize = "auto"')
        return found
    if reading.checkpoint.folder is None:  # a random-init preset: speed work, its vectors mean nothing
        mode = "mean" if pooling == "auto" else pooling
        norm = normalize is True
        reading.add("pooling", mode, "random-init preset: mean" if pooling == "auto" else "settings: model.pooling")
        reading.add("normalize", norm, "settings: model.normalize" if normalize != "auto" else "random-init preset")
        return Pooling(mode, norm)
    if pooling == "auto":
        raise CheckpointError(
            "a bare transformers checkpoint (no modules.json) does not say how to pool: set model.pooling "
            '("mean", "cls", "max" or "mean_sqrt_len") and model.normalize (true or false)'
        )
    reading.add("pooling", pooling, "settings: model.pooling (a bare transformers checkpoint)")
    reading.add("normalize", normalize is True, "settings: model.normalize")
    return Pooling(pooling, normalize is True)


def _tokenizer_limit(folder: Path | None) -> int | None:
    path = folder / "tokenizer_config.json" if folder else None
    if path is None or not path.is_file():
        return None
    limit = json.loads(path.read_text()).get("model_max_length")
    return int(limit) if isinstance(limit, int | float) and limit < HUGE else None


def _max_tokens(reading: Reading, saved: StCheckpoint | None, setting: int) -> int:
    """The checkpoint's own limit as sentence-transformers reads it: its Transformer's max_seq_length, else the
    tokenizer's model_max_length, within what the family's positions take; model.max_tokens > 0 overrides it."""
    checkpoint = reading.checkpoint
    positions, own, where = checkpoint.positions, None, ""
    transformer = saved.first(TRANSFORMERS) if saved else None
    if transformer is not None:
        kwargs = transformer.config.get("processor_kwargs") or transformer.config.get("tokenizer_args") or {}
        for key, value in (("max_seq_length", transformer.config.get("max_seq_length")),
                           ("tokenizer_args.model_max_length", kwargs.get("model_max_length"))):  # fmt: skip
            if value:
                own, where = int(value), saved.where(transformer, key)
                break
    if own is None and (limit := _tokenizer_limit(checkpoint.folder)) is not None:
        inside = (
            checkpoint.folder.relative_to(checkpoint.root).as_posix() + "/"
            if checkpoint.folder != checkpoint.root
            else ""
        )
        own, where = limit, f"{inside}tokenizer_config.json: model_max_length"
    if setting:
        if own is not None and setting > own:
            reading.notes.append(
                f"model.max_tokens = {setting} reads more than the checkpoint's {own} ({where}): texts longer than "
                f"{own} tokens get vectors sentence-transformers does not give"
            )
        reading.add("max tokens", setting, "settings: model.max_tokens")
        return setting
    if own is None or own > positions:
        family = checkpoint.config.model_type
        reading.add("max tokens", positions, f"config.json: what a {family} checkpoint's positions take")
        return positions
    reading.add("max tokens", own, where)
    return own


def _prompts(reading: Reading, saved: StCheckpoint) -> None:
    settings = saved.settings
    prompts = {name: text for name, text in (settings.get("prompts") or {}).items() if isinstance(text, str)}
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"config_sentence_transformers.json: default_prompt_name = {default!r} names none of its prompts "
            f"({', '.join(sorted(prompts)) or 'none'})"
        )
    if default is not None and reading.task in ("rerank", "classification"):
        raise CheckpointError(
            f"config_sentence_transformers.json: default_prompt_name = {default!r}: a cross-encoder's default "
            "prompt is not served; save the model without one"
        )
    reading.prompts, reading.default_prompt_name = prompts, default
    reading.add(
        "prompts", {name: text for name, text in prompts.items() if text}, "config_sentence_transformers.json: prompts"
    )
    reading.add("default prompt", default, "config_sentence_transformers.json: default_prompt_name")
    include = reading.facts.get("include prompt")
    if include is not None and include.value is False and any(prompts.values()):
        raise CheckpointError(
            f"{include.source} = false with prompts: pooling that leaves the prompt's tokens out is not served; "
            "save the model with include_prompt=True or without prompts"
        )


def _lowercase(reading: Reading, saved: StCheckpoint | None) -> None:
    transformer = saved.first(TRANSFORMERS) if saved else None
    lower = bool(transformer and transformer.config.get("do_lower_case"))
    where = _key(saved, transformer, "do_lower_case") if transformer else "no sentence-transformers Transformer"
    reading.lowercase = lower
    reading.add("lowercase", lower, where)


def _family(reading: Reading) -> None:
    checkpoint = reading.checkpoint
    module = checkpoint.family.__module__.rsplit(".", 1)[-1]
    reading.add("family", f"{checkpoint.config.model_type} (engines/models/{module}.py)", "config.json: model_type")


def _task(reading: Reading, saved: StCheckpoint | None) -> None:
    """model.task against what the checkpoint is: a refusal where the served numbers would not be the library's."""
    task, config = reading.task, reading.checkpoint.config
    said = saved.model_type if saved else None
    library = ENCODERS.get(said or "")
    if library is not None and task != library and not (task == "hybrid" and library == "embedding"):
        raise CheckpointError(f'{SETTINGS_FILE}: model_type = "{said}": set model.task = "{library}"')
    classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or ())
    if task in ("rerank", "classification") and reading.checkpoint.folder is not None:
        if said == "CrossEncoder" or classifier:
            labels = config.num_labels
            if task == "rerank" and labels != 1:
                raise CheckpointError(
                    f'config.json: num_labels = {labels}: a reranker has one; set model.task = "classification"'
                )
        else:
            architectures = list(config.architectures or [])
            raise CheckpointError(
                f"config.json: architectures = {architectures}: task {task} needs a sequence-classification head "
                "(a CrossEncoder or *ForSequenceClassification checkpoint)"
            )
    if task == "embedding" and (said == "CrossEncoder" or classifier) and reading.checkpoint.folder is not None:
        wanted = "rerank" if config.num_labels == 1 else "classification"
        raise CheckpointError(
            f"config.json: architectures = {list(config.architectures or [])}, num_labels = {config.num_labels}: "
            f'a sequence-classification head; set model.task = "{wanted}"'
        )
    source = "settings: model.task"
    if said:
        source += f" (the checkpoint is a {said}: {SETTINGS_FILE}: model_type)"
    reading.add("task", task, source)


def _raw_config(reading: Reading) -> dict:
    folder = reading.checkpoint.folder
    return json.loads((folder / "config.json").read_text()) if folder else {}


def _head(reading: Reading, saved: StCheckpoint | None) -> None:
    """A classifier's labels, a reranker's score activation as CrossEncoder.predict applies it (each release kept
    it somewhere else; the routes answer the logit's sigmoid and TEI's raw_scores the logit either way)."""
    config = reading.checkpoint.config
    if reading.task == "classification":
        labels = [config.id2label[i] for i in range(config.num_labels)]
        reading.add("labels", labels, "config.json: id2label")
    if reading.task != "rerank":
        return
    raw = _raw_config(reading)
    st_settings, st_config = (saved.settings if saved else {}), raw.get("sentence_transformers") or {}
    found = [  # 6.x, 4.x-5.x, before 4.0
        (st_settings.get("activation_fn"), "config_sentence_transformers.json: activation_fn"),
        (st_config.get("activation_fn"), "config.json: sentence_transformers.activation_fn"),
        (raw.get("sbert_ce_default_activation_function"), "config.json: sbert_ce_default_activation_function"),
    ]
    activation, where = next(((value, key) for value, key in found if value), (None, ""))
    name = activation.rsplit(".", 1)[-1] if activation else "Sigmoid"
    reading.add(
        "score", f"the logit; CrossEncoder.predict applies {name}", where or "CrossEncoder's default, one label"
    )


def _sparse_route(saved: StCheckpoint, modules: tuple[Module, ...], reading: Reading) -> Pooling:
    """[MLMTransformer or Transformer(fill-mask)] + SpladePooling: each token's MLM logits, max-pooled."""
    activation = None
    for module in modules:
        if module.kind in TRANSFORMERS:
            task = module.config.get("transformer_task", "fill-mask")
            if module.kind == "Transformer" and task != "fill-mask":
                key = saved.where(module, "transformer_task")
                raise CheckpointError(f'{key} = "{task}": a SparseEncoder reads a "fill-mask" Transformer')
        elif module.kind == "SpladePooling" and activation is None:
            strategy = module.config.get("pooling_strategy", "max")
            if strategy != "max":
                key = saved.where(module, "pooling_strategy")
                raise CheckpointError(f'{key} = "{strategy}": only "max" is served')
            activation = module.config.get("activation_function", "relu")
            if activation not in ("relu", "log1p_relu"):
                key = saved.where(module, "activation_function")
                raise CheckpointError(f'{key} = "{activation}": relu or log1p_relu are served')
            reading.add("pooling", "max (SpladePooling)", saved.where(module, "pooling_strategy"))
            reading.add("activation", activation, saved.where(module, "activation_function"))
        elif module.kind not in INERT:
            raise _refuse(saved, module, "is not served by the sparse task")
    if activation is None:
        raise CheckpointError("task sparse needs a SparseEncoder with a SpladePooling module; this one has none")
    return Pooling("max", normalize=False, splade=activation)


def _sparse(reading: Reading, saved: StCheckpoint | None) -> Pooling:
    """A SparseEncoder's document side (a Router's document route), its query side if static, max_active_dims."""
    if saved is None:
        reading.add("pooling", "max (SpladePooling)", "a bare masked-LM checkpoint: SPLADE's")
        reading.add("activation", "relu", "a bare masked-LM checkpoint: SPLADE's")
        return Pooling("max", normalize=False, splade="relu")
    if saved.routes:
        document = saved.routes.get("document") or saved.routes.get(saved.default_route or "")
        if document is None:
            raise CheckpointError(f"router_config.json routes {sorted(saved.routes)}: none is the document side")
        pooling = _sparse_route(saved, document, reading)
        query = saved.routes.get("query", document)
        if [module.kind for module in query] == ["SparseStaticEmbedding"]:
            reading.static_query = query[0]
            reading.add("query side", "static weights per token (SparseStaticEmbedding)", saved.where(query[0]))
        elif query != document:
            raise CheckpointError("router_config.json: a query side other than SparseStaticEmbedding is not served")
    else:
        pooling = _sparse_route(saved, saved.modules, reading)
    dims = saved.settings.get("max_active_dims") or 0
    reading.max_active_dims = int(dims)
    reading.add(
        "max active dims", reading.max_active_dims or None, "config_sentence_transformers.json: max_active_dims"
    )
    return pooling


def _library(reading: Reading, saved: StCheckpoint | None) -> None:
    if saved is None:
        library = "random-init preset" if reading.checkpoint.folder is None else "transformers (no modules.json)"
        reading.add("saved by", library, "no modules.json")
        return
    versions = saved.settings.get("__version__") or {}
    release = versions.get("sentence_transformers") or "a release before 2.0"
    reading.add("saved by", f"sentence-transformers {release} {saved.model_type or ''}".strip(), SETTINGS_FILE)
    if saved.settings.get("similarity_fn_name"):
        similarity = saved.settings["similarity_fn_name"]
        reading.add("similarity", similarity, "config_sentence_transformers.json: similarity_fn_name")


def read_checkpoint(checkpoint: Checkpoint, task: str, max_tokens: int, pooling: str = "auto",
                    normalize: str | bool = "auto") -> Reading:  # fmt: skip
    """Everything the export of `checkpoint` for `task` serves that the checkpoint says (or the settings, where it
    says nothing), each with its source; CheckpointError naming what to change where it cannot be served."""
    saved = read_modules(checkpoint.root)
    reading = Reading(checkpoint, task, Pooling("mean", normalize=False), 0)
    _library(reading, saved)
    _family(reading)
    _task(reading, saved)
    if task == "embedding":
        found = _embedder_modules(saved, reading) if saved and saved.model_type != "CrossEncoder" else None
        reading.pooling = _settings_pooling(reading, pooling, normalize, found)
    elif task == "sparse":
        reading.pooling = _sparse(reading, saved)
    elif task == "hybrid":  # BGEM3FlagModel's dense vector, whatever its modules.json says
        reading.pooling = Pooling("cls", normalize=True)
        reading.add("pooling", "cls", "BGEM3FlagModel: the first token's state")
        reading.add("normalize", True, "BGEM3FlagModel: normalized")
    _head(reading, saved)
    if saved is not None and task != "multi_vector":  # a multi-vector model's prompts are its sides'
        _prompts(reading, saved)
    _lowercase(reading, saved)
    reading.max_tokens = _max_tokens(reading, saved, max_tokens)
    return reading
