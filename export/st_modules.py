"""A sentence-transformers checkpoint's modules as every release wrote them, 2.x to 6.x: modules.json's entries by
class name, each with its own config, and the model's config_sentence_transformers.json.

Releases differ in where a class lives (`sentence_transformers.models.Pooling` in 2.x-4.x,
`...sentence_transformer.modules.pooling.Pooling` in 6.x), in a config's keys (Pooling's `pooling_mode_mean_tokens:
true` before 6.0, `pooling_mode: "mean"` after) and in file names (a Transformer's sentence_bert_config.json, or
sentence_roberta_config.json and its siblings in the oldest saves). A module is read by its class name, so every
path of a class reads alike. A Router (inference-free sparse encoders) holds its routes' modules in folders of its
own: each route's modules are read as the top level's are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from export.errors import CheckpointError

MODULES_FILE = "modules.json"
SETTINGS_FILE = "config_sentence_transformers.json"
# What a Transformer's config has been called: sentence_bert_config.json, and per family in the oldest saves.
TRANSFORMER_CONFIGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
TRANSFORMERS = ("Transformer", "MLMTransformer")  # the modules that hold the Hugging Face model
ROUTER_CONFIG = "router_config.json"


@dataclass(frozen=True)
class Module:
    """One module: its class name, where it was saved and what its config says."""

    kind: str  # the class name: Transformer, Pooling, Normalize, Dense, SpladePooling, ...
    type: str  # the class path as modules.json writes it
    folder: Path  # the module's own folder
    config_name: str  # its config file's name inside folder ("" when it has none)
    config: dict = field(default_factory=dict)

    def where(self, key: str | None = None, root: Path | None = None) -> str:
        """Where a fact of this module was read: `1_Pooling/config.json: pooling_mode`."""
        relative = self.folder.relative_to(root) if root is not None else self.folder
        place = f"{relative.as_posix() + '/' if str(relative) != '.' else ''}{self.config_name or self.kind}"
        return f"{place}: {key}" if key else place


@dataclass(frozen=True)
class StCheckpoint:
    """A checkpoint folder sentence-transformers saved: its modules in order (a Router's by route) and its
    config_sentence_transformers.json (empty where the release wrote none)."""

    root: Path
    modules: tuple[Module, ...]
    settings: dict
    routes: dict[str, tuple[Module, ...]] = field(default_factory=dict)  # a Router's routes; {} without one
    default_route: str | None = None

    @property
    def model_type(self) -> str | None:
        """SentenceTransformer, CrossEncoder, SparseEncoder or MultiVectorEncoder (6.x; None before)."""
        return self.settings.get("model_type")

    def first(self, kinds: tuple[str, ...]) -> Module | None:
        return next((module for module in self.all_modules() if module.kind in kinds), None)

    def all_modules(self) -> list[Module]:
        """The top level's modules and every route's."""
        return [*self.modules, *(module for route in self.routes.values() for module in route)]

    def where(self, module: Module, key: str | None = None) -> str:
        return module.where(key, self.root)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} cannot be read as JSON: {exc}") from None


def _module(folder: Path, type_path: str) -> Module:
    kind = type_path.rsplit(".", 1)[-1]
    names = TRANSFORMER_CONFIGS if kind in TRANSFORMERS else ("config.json",)
    if kind == "Router":
        names = (ROUTER_CONFIG,)
    for name in names:
        if (folder / name).is_file():
            return Module(kind, type_path, folder, name, _read_json(folder / name))
    return Module(kind, type_path, folder, "")


def _router(root: Path, router: Module) -> tuple[dict[str, tuple[Module, ...]], str | None]:
    """A Router's routes (query, document, ...): each its modules, in their folders under the Router's."""
    types, structure = router.config.get("types", {}), router.config.get("structure", {})
    routes = {
        name: tuple(_module(router.folder / module_id, types[module_id]) for module_id in ids)
        for name, ids in structure.items()
    }
    return routes, router.config.get("parameters", {}).get("default_route")


def read_modules(root: Path | None) -> StCheckpoint | None:
    """The checkpoint's sentence-transformers modules, or None where it holds no modules.json (a bare transformers
    checkpoint, a random-init preset)."""
    if root is None or not (root / MODULES_FILE).is_file():
        return None
    entries = json.loads((root / MODULES_FILE).read_text())
    modules = tuple(_module(root / entry.get("path", ""), entry["type"]) for entry in entries)
    settings = _read_json(root / SETTINGS_FILE) if (root / SETTINGS_FILE).is_file() else {}
    routers = [module for module in modules if module.kind == "Router"]
    routes, default_route = _router(root, routers[0]) if routers else ({}, None)
    return StCheckpoint(root, modules, settings, routes, default_route)


def transformer_folder(root: Path) -> Path:
    """Where the Hugging Face model of a sentence-transformers save lies: the folder of its (first document-side)
    Transformer; the root itself for almost every save, a route's folder for a Router's."""
    saved = read_modules(root)
    if saved is None:
        return root
    routes = [saved.routes[name] for name in ("document", saved.default_route) if name in saved.routes]
    for module in [*saved.modules, *(module for route in routes for module in route)]:
        if module.kind in TRANSFORMERS:
            return module.folder
    return root
