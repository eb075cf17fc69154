"""What must hold within and between the settings' sections, beyond each value's type: one SettingsError naming
the key at fault."""

from __future__ import annotations

from settings.schema import (
    ENGINE_KINDS,
    POOLINGS,
    PRECISIONS,
    QUANTIZED,
    TASKS,
    TOPOLOGIES,
    LoadTestSettings,
    Settings,
    SettingsError,
)


def check(settings: Settings) -> None:
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
    if engine.kind == "onnxruntime_cpu" and engine.precision not in ("fp32", "auto"):
        raise SettingsError("engine.kind onnxruntime_cpu runs fp32 only")
    if engine.kind == "tensorrt" and engine.precision == "auto":
        raise SettingsError("engine.kind tensorrt builds its plan at one precision: set engine.precision")
    if engine.precision in QUANTIZED and engine.kind != "tensorrt":
        raise SettingsError(f"engine.precision {engine.precision} needs engine.kind tensorrt")
    _check_sparse(settings)
    if model.max_tokens != 0 and not 2 <= model.max_tokens <= 8192:
        # The checkpoint's own limit (512 for BERT, 8,192 for ModernBERT) is checked at export, where it is known.
        raise SettingsError("model.max_tokens must be 0 (the checkpoint's own limit) or between 2 and 8192")
    if model.pooling not in POOLINGS:
        raise SettingsError(f"model.pooling must be one of {POOLINGS}, not {model.pooling!r}")
    if model.normalize not in ("auto", True, False):
        raise SettingsError(f'model.normalize must be "auto", true or false, not {model.normalize!r}')
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
    on_cpu = engine.kind in ("torch", "auto") and not settings.encoder.gpus
    if on_cpu and engine.precision not in ("fp32", "bf16", "auto"):
        raise SettingsError(f"engine.kind {engine.kind} without encoder.gpus runs on the CPU: fp32, bf16 GEMMs or auto")
    buckets = settings.tensorrt.sequence_buckets
    if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] < 2:
        raise SettingsError("tensorrt.sequence_buckets must be strictly increasing token counts >= 2")
    if engine.kind == "tensorrt" and buckets[-1] != model.max_tokens:
        raise SettingsError(
            "the last tensorrt.sequence_buckets entry must equal model.max_tokens (set it for tensorrt)"
        )
    if engine.kind == "onnxruntime_cpu" and settings.encoder.gpus:
        raise SettingsError("engine.kind onnxruntime_cpu runs on the CPU: leave encoder.gpus empty")
    if settings.ensemble.max_batch_size > settings.tokenizer.max_batch_size:
        raise SettingsError("ensemble.max_batch_size must not exceed tokenizer.max_batch_size")
    if settings.ensemble.max_batch_size > settings.encoder.max_batch_size:
        raise SettingsError("ensemble.max_batch_size must not exceed encoder.max_batch_size")
    server = settings.server
    if server.watchdog_interval_s < 0 or server.exit_timeout_s < 1 or server.unload_s_per_stub < 0:
        raise SettingsError("server needs watchdog_interval_s >= 0, exit_timeout_s >= 1 and unload_s_per_stub >= 0")
    if server.log_format not in ("text", "json"):
        raise SettingsError(f'server.log_format must be "text" or "json", not {server.log_format!r}')
    if server.max_restarts < 0 or server.restart_window_s <= 0:
        raise SettingsError("server needs max_restarts >= 0 and restart_window_s > 0")
    front = settings.front
    if front.workers < 0 or front.max_body_bytes < settings.tokenizer.max_request_bytes:
        raise SettingsError("front needs workers >= 0 and max_body_bytes >= tokenizer.max_request_bytes")
    api = settings.api
    if api.port < 0 or api.workers < 0 or min(api.max_inputs, api.max_concurrent_requests, api.grpc_channels) < 1:
        raise SettingsError(
            "api needs port >= 0, workers >= 0, max_inputs, max_concurrent_requests, grpc_channels >= 1"
        )
    if api.coalesce_calls < 0 or not 0 <= api.coalesce_window_ms <= 100:
        raise SettingsError("api needs coalesce_calls >= 0 and coalesce_window_ms in 0..100")
    for origin in api.cors_allow_origins:
        if not isinstance(origin, str) or not (origin == "*" or origin.startswith(("http://", "https://"))):
            raise SettingsError(f'api.cors_allow_origins: {origin!r} is not "*" or an http(s):// origin')
    if api.max_body_bytes < 1 or api.timeout_s <= 0:
        raise SettingsError("api needs max_body_bytes >= 1 and timeout_s > 0")
    _check_priority(settings)
    tenants = settings.tenants
    if not isinstance(tenants.keys_file, str) or tenants.reload_s <= 0:
        raise SettingsError('tenants needs keys_file, a path or "", and reload_s > 0')
    if server.canary_interval_s < 0 or server.canary_timeout_s <= 0:
        raise SettingsError("server needs canary_interval_s >= 0 (0: off) and canary_timeout_s > 0")
    tracing = settings.tracing
    if tracing.endpoint and not tracing.endpoint.startswith(("http://", "https://")):
        raise SettingsError(
            f"tracing.endpoint must be an http(s):// URL of an OTLP/HTTP collector, not {tracing.endpoint!r}"
        )
    if not 0 < tracing.sample_rate <= 1 or not tracing.service_name:
        raise SettingsError("tracing needs sample_rate in (0, 1] and a service_name")
    if not isinstance(tracing.triton_spans, bool):
        raise SettingsError("tracing.triton_spans is true or false")
    _check_loadtest(settings.loadtest, settings.ensemble.max_batch_size)


def _check_priority(settings: Settings) -> None:
    priority = settings.priority
    if not isinstance(priority.enabled, bool):
        raise SettingsError("priority.enabled is true or false")
    if type(priority.query_max_texts) is not int or priority.query_max_texts < 0:
        raise SettingsError("priority.query_max_texts must be an integer >= 0 (0: only requests naming it are queries)")
    if type(priority.query_instances) is not int or priority.query_instances < 1:
        raise SettingsError("priority.query_instances must be an integer >= 1")
    if type(priority.ingestion_nice) is not int or not 0 <= priority.ingestion_nice <= 19:
        raise SettingsError("priority.ingestion_nice must be an integer in 0..19 (0: off)")
    if min(priority.query_timeout_ms, priority.ingestion_timeout_ms) < 0:
        raise SettingsError("priority needs query_timeout_ms and ingestion_timeout_ms >= 0 (0: api.timeout_s)")
    for name in ("ingestion_chunk_texts", "ingestion_on_gpu"):
        if type(getattr(priority, name)) is not int or getattr(priority, name) < 0:
            raise SettingsError(f"priority.{name} must be an integer >= 0 (0: no bound)")
    yield_ms = priority.query_yield_ms
    if isinstance(yield_ms, bool) or not isinstance(yield_ms, int | float) or yield_ms < 0:
        raise SettingsError("priority.query_yield_ms must be a number of milliseconds >= 0")


def _check_sparse(settings: Settings) -> None:
    sparse = settings.sparse
    if type(sparse.top_k) is not int or sparse.top_k < 0:
        raise SettingsError("sparse.top_k must be an integer >= 0 (0: every entry)")
    if isinstance(sparse.threshold, bool) or not isinstance(sparse.threshold, int | float) or sparse.threshold < 0:
        raise SettingsError("sparse.threshold must be a number >= 0 (0: every non-zero entry)")
    for task in ("sparse", "multi_vector", "hybrid"):
        if settings.model.task == task and settings.topology != "one_stage":
            raise SettingsError(f'model.task {task} is served by the one-stage model: ensemble.topology "one_stage"')


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
