"""Several models in one server: one settings file per model, one generated repository, one tritonserver.

Each file is read over the defaults as a single one is (loading.load_settings). The server-wide sections
([server], [front], [api], [priority], [tenants], [tracing]: ports, the build folder, the fronts) come from the
first file; a later file that sets one of their keys to another value is refused, naming both files and the
key. With one file the model is served as `ensemble` (its two-stage steps as `tokenizer`, `encoder`,
`postprocess`), as always; with several, each model is served under its model.name (its steps as
`<name>-tokenizer`, ...). A one-stage model's query lane is `<name>-query` ([priority]).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from common.contract import QUERY_LANE_SUFFIX
from settings.loading import DEFAULT_SETTINGS, load_settings, own_sections
from settings.schema import (
    ApiSettings,
    FrontSettings,
    PrioritySettings,
    ServerSettings,
    Settings,
    SettingsError,
    TenantSettings,
    TracingSettings,
)

SERVER_WIDE = ("server", "front", "api", "priority", "tenants", "tracing")
SINGLE_MODEL_NAME = "ensemble"
# What a model may be called when several share a server: a Triton model folder and a URL path segment.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclasses.dataclass(frozen=True)
class ServedNames:
    """The Triton models one settings file becomes: what clients call, the two-stage steps and the query lane (a
    one-stage model's second copy for queries); "" for those it lacks."""

    model: str
    tokenizer: str
    encoder: str
    postprocess: str
    query_lane: str = ""

    def lane_in(self, repository: Path) -> str:
        """The query lane if `repository` holds it (generated with priorities on), else ""."""
        return self.query_lane if self.query_lane and (repository / self.query_lane).is_dir() else ""


@dataclasses.dataclass(frozen=True)
class Deployment:
    """The models one server serves, in the order their files were given, and the overrides applied to each (the
    processes that read the files again, the API front's workers, get them too)."""

    models: tuple[Settings, ...]
    overrides: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Settings | Deployment) -> Deployment:
        return settings if isinstance(settings, Deployment) else cls((settings,))

    @property
    def first(self) -> Settings:
        return self.models[0]

    @property
    def server(self) -> ServerSettings:
        return self.first.server

    @property
    def front(self) -> FrontSettings:
        return self.first.front

    @property
    def api(self) -> ApiSettings:
        return self.first.api

    @property
    def priority(self) -> PrioritySettings:
        return self.first.priority

    @property
    def tenants(self) -> TenantSettings:
        return self.first.tenants

    @property
    def tracing(self) -> TracingSettings:
        return self.first.tracing

    @property
    def build_dir(self) -> Path:
        return self.first.build_dir

    @property
    def repository_dir(self) -> Path:
        return self.first.repository_dir

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(settings.path for settings in self.models)

    @property
    def uses_gpus(self) -> bool:
        return any(settings.encoder.gpus for settings in self.models)

    @property
    def takes_gpu_turns(self) -> bool:
        """Whether a model's stubs and its query lane's take turns on their GPUs (common/gpu_board.py)."""
        return any(settings.encoder.gpus and has_query_lane(settings) for settings in self.models)

    @property
    def rate_limited(self) -> bool:
        """Whether tritonserver runs its rate limiter: it honours the instance priorities of encoder.warm_first,
        which a Python encoder's instance groups carry (a TensorRT encoder's do not)."""
        return any(s.encoder.prefers_first and s.engine.kind != "tensorrt" for s in self.models)

    @property
    def triton_exit_timeout_s(self) -> int:
        """tritonserver's own --exit-timeout-secs: the drain's bound once more (for requests still in flight when
        it ran out), plus server.unload_s_per_stub for every Python stub, which Triton 2.51 unloads one after
        another (its Python backend checks each stub's health for 1 s before it asks the stub to finish)."""
        stubs = sum(python_stubs(settings) for settings in self.models)
        return self.server.exit_timeout_s + math.ceil(self.server.unload_s_per_stub * stubs)

    def names(self, settings: Settings) -> ServedNames:
        name = SINGLE_MODEL_NAME if len(self.models) == 1 else settings.model.name
        lane = f"{name}{QUERY_LANE_SUFFIX}" if has_query_lane(settings) else ""
        if len(self.models) == 1:
            return ServedNames(name, "tokenizer", "encoder", "postprocess", lane)
        return ServedNames(name, f"{name}-tokenizer", f"{name}-encoder", f"{name}-postprocess", lane)

    def served(self) -> dict[str, Settings]:
        """Each model by the name clients call it."""
        return {self.names(settings).model: settings for settings in self.models}


def has_query_lane(settings: Settings) -> bool:
    """Whether the model gets a query lane: priorities on, one stage (two stages share their steps' queues)."""
    return settings.priority.enabled and settings.topology == "one_stage"


def python_stubs(settings: Settings) -> int:
    """The stub processes one model's Python stages run, as Triton counts instance groups (the count on each GPU
    listed): one stage, [encoder]'s and the query lane's; two stages, [tokenizer]'s, [encoder]'s unless
    TensorRT serves it, and a classifier's [postprocess]."""
    devices = max(1, len(settings.encoder.gpus))
    encoder = settings.encoder.instances * devices
    if settings.topology == "one_stage":
        lane = settings.priority.query_instances * devices if has_query_lane(settings) else 0
        return encoder + lane
    stubs = settings.tokenizer.instances + (encoder if settings.engine.kind != "tensorrt" else 0)
    return stubs + (settings.postprocess.instances if settings.model.task == "classification" else 0)


def load_deployment(paths: list | tuple = (), overrides: tuple[str, ...] | list[str] = ()) -> Deployment:
    """The settings files (none: the defaults file alone), each read over the defaults and checked, the overrides
    applied to each; the server-wide sections must agree (see the module's docstring)."""
    files = [Path(path).resolve() for path in paths] or [DEFAULT_SETTINGS.resolve()]
    models = tuple(load_settings(path, overrides) for path in files)
    first = models[0]
    for path, settings in zip(files[1:], models[1:], strict=True):
        for section, values in own_sections(path).items():
            if section not in SERVER_WIDE:
                continue
            for key, value in values.items():
                ours = getattr(getattr(first, section), key, value)
                if ours != (tuple(value) if isinstance(value, list) else value):
                    raise SettingsError(
                        f"{path} sets [{section}] {key} = {value!r}, but the server-wide sections come from the first "
                        f"settings file, {files[0]}, which has {ours!r}: set it there, or the same in both"
                    )
        if settings.server.build_dir != first.server.build_dir:
            raise SettingsError(f"{path}: server.build_dir must be the first file's ({first.server.build_dir})")
    if len(models) > 1:
        names = [settings.model.name for settings in models]
        for name in names:
            if not MODEL_NAME.fullmatch(name) or name == SINGLE_MODEL_NAME:
                raise SettingsError(
                    f"model.name {name!r} cannot name a served model: letters, digits, '.', '_', '-', not 'ensemble'"
                )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise SettingsError(f"model.name {repeated[0]!r} names more than one settings file's model")
    return Deployment(models, tuple(overrides))
