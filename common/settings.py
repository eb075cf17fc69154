"""Loads and validates the settings file, the single source for every generated configuration."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETTINGS = ROOT / "model_repository" / "settings.toml"

TASKS = ("embedding", "classification")
ENGINE_KINDS = ("onnxruntime_cpu", "torch_gpu", "tensorrt")
# one_stage: one Python model tokenizes and encodes (the Python engines); two_stage: tokenizer -> encoder, the
# only way to reach a TensorRT encoder. auto picks one_stage where it can.
TOPOLOGIES = ("auto", "one_stage", "two_stage")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
QUANTIZED = ("int8", "fp8")  # TensorRT only, from an ONNX model that already carries Q/DQ nodes


class SettingsError(ValueError):
    """The settings file is malformed or inconsistent."""


# The sections of a settings file. No defaults here: model_repository/settings.toml writes every value once,
# with what it means, and any other settings file states only what differs from it (load_settings).


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    source: str
    name: str
    task: str
    max_tokens: int


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    kind: str
    precision: str
    threads: int
    onnx_opset: int
    onnx_tolerance: float
    options: dict  # the engine's own options (its module docstring)


@dataclasses.dataclass(frozen=True)
class TensorRTSettings:
    """Optimization profiles and builder options for `make engines` (engine.kind = "tensorrt")."""

    sequence_buckets: tuple[int, ...]
    tokens_per_batch: int
    workspace_mib: int
    optimization_level: int
    cuda_graphs: bool
    max_graph_batch: int


@dataclasses.dataclass(frozen=True)
class StageSettings:
    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_size: int
    queue_timeout_us: int


@dataclasses.dataclass(frozen=True)
class EncoderSettings(StageSettings):
    gpus: tuple[int, ...]  # only the encoder runs on GPUs


@dataclasses.dataclass(frozen=True)
class TokenizerSettings(StageSettings):
    max_text_bytes: int
    max_request_bytes: int


@dataclasses.dataclass(frozen=True)
class EnsembleSettings:
    max_batch_size: int
    topology: str


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    health_port: int
    watchdog_interval_s: float
    exit_timeout_s: int
    max_restarts: int
    restart_window_s: float
    build_dir: str


@dataclasses.dataclass(frozen=True)
class FrontSettings:
    """The HTTP front (model_repository/front.py) on server.http_port, before tritonserver's own HTTP."""

    workers: int
    max_body_bytes: int
    triton_http_port: int


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """The OpenAI- and TEI-compatible HTTP front (model_repository/api_front.py)."""

    port: int
    workers: int
    max_body_bytes: int
    max_inputs: int
    max_concurrent_requests: int
    grpc_channels: int
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class LoadTestSettings:
    """The acceptance bar `python -m loadtest` holds a deployment to; its flags override each value."""

    protocol: str
    users: int
    duration_s: float
    batch_sizes: tuple[int, ...]
    batch_weights: tuple[float, ...]
    p50_ms: float
    p99_ms: float
    min_rps: float
    max_fail_ratio: float


@dataclasses.dataclass(frozen=True)
class Settings:
    model: ModelSettings
    engine: EngineSettings
    tokenizer: TokenizerSettings
    encoder: EncoderSettings
    postprocess: StageSettings
    ensemble: EnsembleSettings
    server: ServerSettings
    front: FrontSettings
    api: ApiSettings
    tensorrt: TensorRTSettings
    loadtest: LoadTestSettings
    path: Path

    @property
    def topology(self) -> str:
        """one_stage or two_stage: the setting, with auto resolved."""
        if self.ensemble.topology != "auto":
            return self.ensemble.topology
        return "two_stage" if self.engine.kind == "tensorrt" else "one_stage"

    @property
    def build_dir(self) -> Path:
        return (ROOT / self.server.build_dir).resolve()

    @property
    def export_dir(self) -> Path:
        """Where `export` writes the ONNX model, weights, tokenizer and serving.json."""
        return self.build_dir / "models" / self.model.name

    @property
    def repository_dir(self) -> Path:
        return self.build_dir / "model_repository"

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("path")
        return data

    def as_toml(self) -> str:
        """The settings as one complete TOML file (every key, defaults resolved): what the chart embeds."""
        lines: list[str] = []
        for section, values in self.as_dict().items():
            lines += ["", f"[{section}]"] if lines else [f"[{section}]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        return "\n".join(lines) + "\n"

    def digest(self) -> str:
        """Stable hash of the settings' values, recorded in generated files."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + "}"
    return "[" + ", ".join(_toml_value(item) for item in value) + "]"


def _section(cls, raw: dict, name: str):
    values = dict(raw.get(name, {}))
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown, missing = set(values) - fields, fields - set(values)
    if unknown:
        raise SettingsError(f"[{name}] has unknown keys: {', '.join(sorted(unknown))}")
    if missing:  # only the defaults file can lack a key: every other file is read over it
        raise SettingsError(f"{DEFAULT_SETTINGS.name} lacks [{name}] {', '.join(sorted(missing))}")
    for key in ("preferred_batch_sizes", "gpus", "sequence_buckets", "batch_sizes", "batch_weights"):
        if key in values:
            values[key] = tuple(values[key])
    return cls(**values)


def _check(settings: Settings) -> None:
    model, engine = settings.model, settings.engine
    if model.task not in TASKS:
        raise SettingsError(f"model.task must be one of {TASKS}, not {model.task!r}")
    if engine.kind not in ENGINE_KINDS:
        raise SettingsError(f"engine.kind must be one of {ENGINE_KINDS}, not {engine.kind!r}")
    if engine.precision not in PRECISIONS:
        raise SettingsError(f"engine.precision must be one of {PRECISIONS}, not {engine.precision!r}")
    if settings.ensemble.topology not in TOPOLOGIES:
        raise SettingsError(f"ensemble.topology must be one of {TOPOLOGIES}, not {settings.ensemble.topology!r}")
    if settings.topology == "one_stage" and engine.kind == "tensorrt":
        raise SettingsError('engine.kind tensorrt is its own Triton model: it needs ensemble.topology "two_stage"')
    if not all(isinstance(value, str | int | float | bool) for value in engine.options.values()):
        raise SettingsError("engine.options takes names with plain values (strings, numbers, booleans)")
    if engine.kind == "onnxruntime_cpu" and engine.precision != "fp32":
        raise SettingsError("engine.kind onnxruntime_cpu runs fp32 only")
    if engine.precision in QUANTIZED and engine.kind != "tensorrt":
        raise SettingsError(f"engine.precision {engine.precision} needs engine.kind tensorrt")
    if not 2 <= model.max_tokens <= 512:
        raise SettingsError("model.max_tokens must be between 2 and 512 (BERT position embeddings)")
    stages = {"tokenizer": settings.tokenizer, "encoder": settings.encoder, "postprocess": settings.postprocess}
    for name, stage in stages.items():
        if stage.max_batch_size < 1 or stage.instances < 1 or stage.max_queue_delay_us < 0:
            raise SettingsError(f"[{name}] needs max_batch_size >= 1, instances >= 1, max_queue_delay_us >= 0")
        if stage.max_queue_size < 0 or stage.queue_timeout_us < 0:
            raise SettingsError(f"[{name}] needs max_queue_size >= 0 and queue_timeout_us >= 0")
        if any(not 1 <= size <= stage.max_batch_size for size in stage.preferred_batch_sizes):
            raise SettingsError(f"[{name}] preferred_batch_sizes must lie in 1..max_batch_size")
    for key in ("max_text_bytes", "max_request_bytes"):
        value = getattr(settings.tokenizer, key)
        if type(value) is not int or value < 1:
            raise SettingsError(f"tokenizer.{key} must be a positive integer")
    if settings.tokenizer.max_request_bytes < settings.tokenizer.max_text_bytes:
        raise SettingsError("tokenizer.max_request_bytes must be at least tokenizer.max_text_bytes")
    if engine.kind == "tensorrt" and not settings.encoder.gpus:
        raise SettingsError("engine.kind tensorrt needs encoder.gpus, e.g. [0]")
    if engine.kind == "torch_gpu" and not settings.encoder.gpus and engine.precision not in ("fp32", "bf16"):
        raise SettingsError("engine.kind torch_gpu without encoder.gpus runs on the CPU: fp32, or bf16 GEMMs")
    buckets = settings.tensorrt.sequence_buckets
    if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] < 2:
        raise SettingsError("tensorrt.sequence_buckets must be strictly increasing token counts >= 2")
    if engine.kind == "tensorrt" and buckets[-1] != model.max_tokens:
        raise SettingsError("the last tensorrt.sequence_buckets entry must equal model.max_tokens")
    if engine.kind == "onnxruntime_cpu" and settings.encoder.gpus:
        raise SettingsError("engine.kind onnxruntime_cpu runs on the CPU: leave encoder.gpus empty")
    if settings.ensemble.max_batch_size > settings.tokenizer.max_batch_size:
        raise SettingsError("ensemble.max_batch_size must not exceed tokenizer.max_batch_size")
    if settings.ensemble.max_batch_size > settings.encoder.max_batch_size:
        raise SettingsError("ensemble.max_batch_size must not exceed encoder.max_batch_size")
    server = settings.server
    if server.watchdog_interval_s < 0 or server.exit_timeout_s < 1:
        raise SettingsError("server needs watchdog_interval_s >= 0 and exit_timeout_s >= 1")
    if server.max_restarts < 0 or server.restart_window_s <= 0:
        raise SettingsError("server needs max_restarts >= 0 and restart_window_s > 0")
    front = settings.front
    if front.workers < 0 or front.max_body_bytes < settings.tokenizer.max_request_bytes:
        raise SettingsError("front needs workers >= 0 and max_body_bytes >= tokenizer.max_request_bytes")
    api = settings.api
    if api.port < 0 or api.workers < 1 or min(api.max_inputs, api.max_concurrent_requests, api.grpc_channels) < 1:
        raise SettingsError(
            "api needs port >= 0, workers >= 1, max_inputs, max_concurrent_requests, grpc_channels >= 1"
        )
    if api.max_body_bytes < 1 or api.timeout_s <= 0:
        raise SettingsError("api needs max_body_bytes >= 1 and timeout_s > 0")
    _check_loadtest(settings.loadtest, settings.ensemble.max_batch_size)


def _check_loadtest(load: LoadTestSettings, max_batch_size: int) -> None:
    if load.protocol not in ("grpc", "http"):
        raise SettingsError(f"loadtest.protocol must be grpc or http, not {load.protocol!r}")
    if load.users < 1 or load.duration_s <= 0:
        raise SettingsError("loadtest needs users >= 1 and duration_s > 0")
    if not load.batch_sizes or len(load.batch_weights) != len(load.batch_sizes):
        raise SettingsError("loadtest.batch_weights needs one weight per loadtest.batch_sizes entry")
    if any(not 1 <= size <= max_batch_size for size in load.batch_sizes) or min(load.batch_weights) <= 0:
        raise SettingsError("loadtest.batch_sizes must lie in 1..ensemble.max_batch_size, with weights > 0")
    if not 0 < load.p50_ms <= load.p99_ms:
        raise SettingsError("loadtest needs 0 < p50_ms <= p99_ms")
    if load.min_rps < 0 or not 0 <= load.max_fail_ratio <= 1:
        raise SettingsError("loadtest needs min_rps >= 0 and max_fail_ratio in 0..1")


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


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read settings {path}: {exc}") from None


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


def load_settings(path: str | Path | None = None, overrides: tuple[str, ...] | list[str] = ()) -> Settings:
    """The settings file (default: model_repository/settings.toml) over the defaults, checked; overrides as in
    apply_override."""
    raw = layered(path, overrides)
    known = {f.name for f in dataclasses.fields(Settings)} - {"path"}
    unknown = set(raw) - known
    if unknown:
        raise SettingsError(f"unknown sections: {', '.join(sorted(unknown))}")
    settings = Settings(
        model=_section(ModelSettings, raw, "model"),
        engine=_section(EngineSettings, raw, "engine"),
        tokenizer=_section(TokenizerSettings, raw, "tokenizer"),
        encoder=_section(EncoderSettings, raw, "encoder"),
        postprocess=_section(StageSettings, raw, "postprocess"),
        ensemble=_section(EnsembleSettings, raw, "ensemble"),
        server=_section(ServerSettings, raw, "server"),
        front=_section(FrontSettings, raw, "front"),
        api=_section(ApiSettings, raw, "api"),
        tensorrt=_section(TensorRTSettings, raw, "tensorrt"),
        loadtest=_section(LoadTestSettings, raw, "loadtest"),
        path=Path(path or DEFAULT_SETTINGS).resolve(),
    )
    _check(settings)
    return settings
