"""Reading settings files: the defaults file, another file read over it key by key (as Helm reads -f values over
values.yaml), then command-line overrides; checked before anyone sees them."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import tomllib

from settings.checks import check
from settings.schema import (
    RENAMED_ENGINE_KINDS,
    ApiSettings,
    EncoderSettings,
    EngineSettings,
    EnsembleSettings,
    FrontSettings,
    LoadTestSettings,
    ModelSettings,
    PrioritySettings,
    ServerSettings,
    Settings,
    SettingsError,
    SparseSettings,
    StageSettings,
    TenantSettings,
    TensorRTSettings,
    TokenizerSettings,
    TracingSettings,
)

DEFAULT_SETTINGS = Path(__file__).resolve().parent / "defaults.toml"


def _section(cls, raw: dict, name: str):
    values = dict(raw.get(name, {}))
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown, missing = set(values) - fields, fields - set(values)
    if unknown:
        raise SettingsError(f"[{name}] has unknown keys: {', '.join(sorted(unknown))}")
    if missing:  # only the defaults file can lack a key: every other file is read over it
        raise SettingsError(f"{DEFAULT_SETTINGS.name} lacks [{name}] {', '.join(sorted(missing))}")
    for key in (
        "preferred_batch_sizes",
        "gpus",
        "sequence_buckets",
        "batch_sizes",
        "batch_weights",
        "cors_allow_origins",
    ):
        if key in values:
            values[key] = tuple(values[key])
    return cls(**values)


def apply_override(raw: dict, override: str) -> None:
    """One "section.key=value" (value in TOML syntax; a dotted key reaches into a table such as
    engine.options.spin_us) into the raw settings, as if the file said so: a variant for a benchmark run."""
    key, sep, value = override.partition("=")
    names = key.strip().split(".")
    if not sep or len(names) < 2 or not all(names):
        raise SettingsError(f"an override reads section.key=value, not {override!r}")
    try:
        parsed = tomllib.loads(f"value = {value.strip()}")["value"]
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"override {override!r}: the value is not TOML ({exc})") from None
    table = raw
    for name in names[:-1]:
        table = table.setdefault(name, {})
        if not isinstance(table, dict):
            raise SettingsError(f"override {override!r}: {name} is not a table")
    table[names[-1]] = parsed


def override_flags(overrides: tuple[str, ...] | list[str]) -> list[str]:
    """The overrides as a command line gives them to a program that reads settings (`--set section.key=value`)."""
    return [part for override in overrides for part in ("--set", override)]


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read settings {path}: {exc}") from None


def own_sections(path: str | Path) -> dict:
    """What the file itself says, before it is read over the defaults."""
    return _read(Path(path))


def layered(path: str | Path | None = None, overrides: tuple[str, ...] | list[str] = ()) -> dict:
    """The raw settings of a file read over the defaults file, key by key within each section (as Helm reads
    -f values over values.yaml), then the overrides. A file other than the defaults names its model."""
    path = Path(path or DEFAULT_SETTINGS).resolve()
    raw = _read(DEFAULT_SETTINGS)
    if path != DEFAULT_SETTINGS.resolve():
        own = _read(path)
        model = own.get("model", {})
        if not isinstance(model, dict) or "source" not in model or "name" not in model:
            raise SettingsError(f"{path}: [model] must name source and name (a model is never inherited)")
        for section, values in own.items():
            if not isinstance(values, dict):
                raise SettingsError(f"{path}: {section} must be a [section]")
            raw.setdefault(section, {}).update(values)
    for override in overrides:
        apply_override(raw, override)
    return raw


def _rename_engine_kind(raw: dict, path: str | Path) -> None:
    """An engine kind under its old name is read as the new one, with a warning (for one release)."""
    kind = raw.get("engine", {}).get("kind")
    if kind in RENAMED_ENGINE_KINDS:
        new = RENAMED_ENGINE_KINDS[kind]
        warnings.warn(
            f"{path}: engine.kind {kind!r} is now {new!r} (it runs on the CPU or the GPUs of encoder.gpus); "
            f"the old name is read as {new!r} until the next release",
            FutureWarning,
            stacklevel=3,
        )
        raw["engine"]["kind"] = new


def load_settings(path: str | Path | None = None, overrides: tuple[str, ...] | list[str] = ()) -> Settings:
    """The settings file (default: settings/defaults.toml) over the defaults, checked; overrides as in
    apply_override."""
    raw = layered(path, overrides)
    _rename_engine_kind(raw, path or DEFAULT_SETTINGS)
    known = {f.name for f in dataclasses.fields(Settings)} - {"path"}
    unknown = set(raw) - known
    if unknown:
        raise SettingsError(f"unknown sections: {', '.join(sorted(unknown))}")
    settings = Settings(
        model=_section(ModelSettings, raw, "model"),
        engine=_section(EngineSettings, raw, "engine"),
        sparse=_section(SparseSettings, raw, "sparse"),
        tokenizer=_section(TokenizerSettings, raw, "tokenizer"),
        encoder=_section(EncoderSettings, raw, "encoder"),
        postprocess=_section(StageSettings, raw, "postprocess"),
        ensemble=_section(EnsembleSettings, raw, "ensemble"),
        server=_section(ServerSettings, raw, "server"),
        front=_section(FrontSettings, raw, "front"),
        api=_section(ApiSettings, raw, "api"),
        priority=_section(PrioritySettings, raw, "priority"),
        tenants=_section(TenantSettings, raw, "tenants"),
        tracing=_section(TracingSettings, raw, "tracing"),
        tensorrt=_section(TensorRTSettings, raw, "tensorrt"),
        loadtest=_section(LoadTestSettings, raw, "loadtest"),
        path=Path(path or DEFAULT_SETTINGS).resolve(),
    )
    check(settings)
    return settings
