"""The settings' schema: one frozen dataclass per section, the values each choice may take, and the Settings that
the rest of the project reads (checks.py says what must hold between them, loading.py reads the files)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from common.contract import ServingSpec
from common.engine_choice import EngineChoice, choose_engine
from settings.cores import api_workers

ROOT = Path(__file__).resolve().parent.parent  # the project: build_dir and settings paths are relative to it

# embedding: pooled vectors; classification: a label and its scores; rerank: a cross-encoder's score for each
# (query, text) pair (the first logit of its sequence-classification head); sparse: each text's non-zero
# vocabulary weights (SPLADE: a masked-LM checkpoint with SpladePooling); multi_vector: each text's token vectors
# (ColBERT: a MultiVectorEncoder checkpoint); hybrid: all three from one pass (BGE-M3: its sparse and colbert heads
# beside the weights).
TASKS = ("embedding", "classification", "rerank", "sparse", "multi_vector", "hybrid")
# The Python engines (model_repository/stages/engines ENGINES), tensorrt, a plan served by Triton's TensorRT
# backend, and auto, which the stage decides when it loads (common/engine_choice.py). torch runs on the GPUs of
# encoder.gpus, or on the CPU without them.
ENGINE_KINDS = ("auto", "onnxruntime_cpu", "torch", "tensorrt")
# Old names, still read for one release with a warning: old name -> kind.
RENAMED_ENGINE_KINDS = {"torch_gpu": "torch"}
# one_stage: one Python model tokenizes and encodes (the Python engines); two_stage: tokenizer -> encoder, the
# only way to reach a TensorRT encoder. auto picks one_stage where it can.
TOPOLOGIES = ("auto", "one_stage", "two_stage")
POOLINGS = ("auto", "mean", "cls", "max", "mean_sqrt_len")  # model.pooling (auto: the checkpoint's modules)
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "int8", "fp8")  # auto: as engine.kind auto
QUANTIZED = ("int8", "fp8")  # TensorRT only, from an ONNX model that already carries Q/DQ nodes


class SettingsError(ValueError):
    """The settings file is malformed or inconsistent."""


# The sections of a settings file. No defaults here: settings/defaults.toml writes every value once, with what it
# means, and any other settings file states only what differs from it (loading.load_settings).


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    source: str
    name: str
    task: str
    max_tokens: int  # 0: the checkpoint's own limit, read at export (serving.json's max_tokens)
    pooling: str  # auto: the checkpoint's; else what a bare transformers checkpoint is pooled by
    normalize: str | bool  # auto: the checkpoint's; else whether a bare checkpoint's vectors are L2-normalized
    calibration_corpus: str  # a text file, a line per text; "": the shipped texts


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    kind: str
    precision: str
    threads: int
    onnx_opset: int
    onnx_tolerance: float
    options: dict  # the engine's own options (its module docstring)


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """What a sparse model's answer keeps of each text's entries, unless a request says otherwise."""

    top_k: int  # the largest k; 0: all
    threshold: float  # those above it; 0: every non-zero one


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
    warm_first: bool

    @property
    def prefers_first(self) -> bool:
        """Whether Triton's rate limiter sends work to the first instance on each device while it is free."""
        return self.warm_first and self.instances > 1


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
    unload_s_per_stub: float
    max_restarts: int
    restart_window_s: float
    build_dir: str
    log_format: str
    canary_interval_s: float
    canary_timeout_s: float


@dataclasses.dataclass(frozen=True)
class FrontSettings:
    """The HTTP front (serving/http_front/proxy.py) on server.http_port, before tritonserver's own HTTP."""

    workers: int
    max_body_bytes: int
    triton_http_port: int


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    """The OpenAI- and TEI-compatible HTTP front (serving/api/app.py)."""

    port: int
    workers: int
    max_body_bytes: int
    max_inputs: int
    max_concurrent_requests: int
    grpc_channels: int
    timeout_s: float
    coalesce_calls: int
    coalesce_window_ms: float
    cors_allow_origins: tuple[str, ...]

    def worker_count(self) -> int:
        """How many workers serve api.port on this machine (settings/cores.py: 0 follows the cores)."""
        return api_workers(self.workers)


PRIORITY_CLASSES = ("query", "ingestion")  # served first to last


@dataclasses.dataclass(frozen=True)
class PrioritySettings:
    """Queries before ingestion: the class of a request, the query lane and each class's time budget."""

    enabled: bool
    query_instances: int
    ingestion_nice: int
    query_max_texts: int
    query_timeout_ms: float
    ingestion_timeout_ms: float
    ingestion_chunk_texts: int
    ingestion_on_gpu: int
    query_yield_ms: float

    def budget_s(self, priority_class: str, default_s: float) -> float:
        """A request's time budget when it sets none: its class's, else default_s (api.timeout_s)."""
        budget_ms = self.query_timeout_ms if priority_class == "query" else self.ingestion_timeout_ms
        return budget_ms / 1000 if budget_ms else default_s

    def class_of(self, texts: int) -> str:
        """The class of a request that names none, by its shape."""
        return "query" if texts <= self.query_max_texts else "ingestion"


@dataclasses.dataclass(frozen=True)
class TenantSettings:
    """API keys by tenant (serving/tenants.py); off while keys_file is empty."""

    keys_file: str
    reload_s: float


@dataclasses.dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry traces of the fronts and tritonserver (serving/tracing.py); off while endpoint is empty."""

    endpoint: str
    sample_rate: float
    service_name: str
    triton_spans: bool


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
    sparse: SparseSettings
    tokenizer: TokenizerSettings
    encoder: EncoderSettings
    postprocess: StageSettings
    ensemble: EnsembleSettings
    server: ServerSettings
    front: FrontSettings
    api: ApiSettings
    priority: PrioritySettings
    tenants: TenantSettings
    tracing: TracingSettings
    tensorrt: TensorRTSettings
    loadtest: LoadTestSettings
    path: Path

    @property
    def topology(self) -> str:
        """one_stage or two_stage: the setting, with auto resolved."""
        if self.ensemble.topology != "auto":
            return self.ensemble.topology
        return "two_stage" if self.engine.kind == "tensorrt" else "one_stage"

    def engine_choice(self) -> EngineChoice:
        """The engine and precision a stage of these settings runs on this machine, "auto" decided as the stage
        decides it for the model's task (common/engine_choice.py)."""
        return choose_engine(self.engine.kind, self.engine.precision, bool(self.encoder.gpus), self.model.task)

    @property
    def build_dir(self) -> Path:
        return (ROOT / self.server.build_dir).resolve()

    @property
    def export_dir(self) -> Path:
        """Where `export` writes the ONNX model, weights, tokenizer and serving.json."""
        return self.build_dir / "models" / self.model.name

    def max_tokens(self, export_dir: Path | None = None) -> int:
        """The tokens a text is cut to: model.max_tokens, or (0) the checkpoint's own limit, which its export
        (export_dir, else the settings' own) wrote into serving.json."""
        if self.model.max_tokens:
            return self.model.max_tokens
        return ServingSpec.load(export_dir or self.export_dir).max_tokens

    @property
    def repository_dir(self) -> Path:
        return self.build_dir / "repository"

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("path")
        return data

    def as_toml(self, leave_out: tuple[str, ...] = ()) -> str:
        """The settings as one complete TOML file (every key, defaults resolved): what the chart embeds; a later
        model of several leaves out the server-wide sections (deployment.SERVER_WIDE), which are the first's."""
        lines: list[str] = []
        for section, values in self.as_dict().items():
            if section in leave_out:
                continue
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
