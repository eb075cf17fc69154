"""Every config.pbtxt of the model repository, built as Triton's own ModelConfig protobuf from the settings and
the exported model's serving spec: the one-stage model, or the two-stage ensemble and its steps."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from common.contract import (
    CHUNK_COUNTS,
    CHUNK_EMBEDDINGS,
    HYBRID_HEADS_FILE,
    OPTION_PREFIX,
    PROJECTION_FILE,
    QUERY_INPUT,
    SCORE_OUTPUT,
    SPARSE_HEAD_FILE,
    SPARSE_INDICES,
    SPARSE_THRESHOLD,
    SPARSE_TOP_K,
    SPARSE_VALUES,
    TEXT_INPUT,
    TOKEN_COUNTS,
    TOKEN_VECTORS,
    TOKEN_VECTORS_FP32,
    TOKENS_OUTPUT,
    ServingSpec,
)
from settings import Settings
from settings.deployment import ServedNames
from settings.schema import EncoderSettings, StageSettings
from settings.tensorrt_profiles import graph_batches, profiles

# encoder.warm_first: the rate limiter's priority of the instances after the first on each device. It picks the
# free instance with the least executions x priority, so the first takes all but about 1 in 1000 of what arrives
# while it is free.
WARM_FIRST_PRIORITY = 1000
# Files each engine kind needs from the export folder, beside serving.json.
ENGINE_FILES = {
    "auto": ("model.onnx", "config.json", "model.safetensors"),  # either engine: the stage decides when it loads
    "onnxruntime_cpu": ("model.onnx",),
    "torch": ("config.json", "model.safetensors"),
    "tensorrt": ("model.plan", "model.plan.json"),
}


# The heads an engine applies itself, by (task, a file of the engine's): the MLM decoder a sparse model's ONNX
# graph is projected with; a multi-vector model's projection and a hybrid model's heads on the torch engine.
TASK_FILES = {
    ("sparse", "model.onnx"): SPARSE_HEAD_FILE,
    ("multi_vector", "model.safetensors"): PROJECTION_FILE,
    ("hybrid", "model.safetensors"): HYBRID_HEADS_FILE,
}


def engine_files(kind: str, spec: ServingSpec) -> tuple[str, ...]:
    """ENGINE_FILES of the kind, and the heads of the task that its engine reads beside them (TASK_FILES)."""
    files = ENGINE_FILES[kind]
    return (*files, *(name for (task, marker), name in TASK_FILES.items() if task == spec.task and marker in files))


def _tensor(cls, name: str, data_type: int, dims: list[int], **extra):
    return cls(name=name, data_type=data_type, dims=dims, **extra)


def _batching(stage: StageSettings, preferred: list[int] | None = None) -> mc.ModelDynamicBatching:
    batching = mc.ModelDynamicBatching(
        preferred_batch_size=preferred or list(stage.preferred_batch_sizes),
        max_queue_delay_microseconds=stage.max_queue_delay_us,
    )
    if stage.max_queue_size or stage.queue_timeout_us:
        # A bounded queue fails fast under overload instead of letting latency grow without limit.
        batching.default_queue_policy.CopyFrom(
            mc.ModelQueuePolicy(
                timeout_action=mc.ModelQueuePolicy.REJECT,
                default_timeout_microseconds=stage.queue_timeout_us,
                allow_timeout_override=True,
                max_queue_size=stage.max_queue_size,
            )
        )
    return batching


def _instances(stage: StageSettings) -> list[mc.ModelInstanceGroup]:
    """One group of stage.instances per device; encoder.warm_first: the first instance on each device in a group
    of its own that Triton's rate limiter prefers (it picks the free instance with the least executions times
    priority), so that work goes to the others only while it is busy."""
    gpus = list(stage.gpus) if isinstance(stage, EncoderSettings) else []  # only the encoder runs on GPUs
    kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
    if not (isinstance(stage, EncoderSettings) and stage.prefers_first):
        return [mc.ModelInstanceGroup(kind=kind, count=stage.instances, gpus=gpus)]
    return [
        mc.ModelInstanceGroup(kind=kind, count=1, gpus=gpus, rate_limiter=mc.ModelRateLimiter(priority=1)),
        mc.ModelInstanceGroup(
            kind=kind, count=stage.instances - 1, gpus=gpus,
            rate_limiter=mc.ModelRateLimiter(priority=WARM_FIRST_PRIORITY),
        ),
    ]  # fmt: skip


def _parameters(values: dict[str, object]) -> dict[str, mc.ModelParameter]:
    return {key: mc.ModelParameter(string_value=str(value)) for key, value in values.items()}


def _python_stage(name: str, stage: StageSettings, **fields) -> mc.ModelConfig:
    """A Python-backend stage with the settings' batch size, dynamic batching and instance group."""
    return mc.ModelConfig(
        name=name,
        backend="python",
        max_batch_size=stage.max_batch_size,
        dynamic_batching=_batching(stage),
        instance_group=_instances(stage),
        **fields,
    )


def tokenizer_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    stage = settings.tokenizer
    return _python_stage(
        names.tokenizer,
        stage,
        input=_text_inputs(spec),
        output=[
            *(_tensor(mc.ModelOutput, name, mc.TYPE_INT32, [-1]) for name in spec.engine_inputs),
            _tensor(mc.ModelOutput, TOKENS_OUTPUT, mc.TYPE_INT32, [1]),
        ],
        parameters=_parameters(
            {
                **_text_limits(settings, spec),
                "pairs": "true" if spec.pairs else "false",
                # A TensorRT encoder batches only equal shapes: pad each request up to a profile's bucket.
                "pad_to_buckets": ",".join(map(str, settings.tensorrt.sequence_buckets))
                if settings.engine.kind == "tensorrt"
                else "",
            }
        ),
        model_warmup=_text_warmup(spec, stage.max_batch_size),
    )


def _text_inputs(spec: ServingSpec) -> list[mc.ModelInput]:
    """TYPE_STRING [1] per row: the text, and a reranker's query beside it."""
    names = (QUERY_INPUT, TEXT_INPUT) if spec.pairs else (TEXT_INPUT,)
    return [_tensor(mc.ModelInput, name, mc.TYPE_STRING, [1]) for name in names]


def _engine_parameters(settings: Settings) -> dict[str, object]:
    engine = settings.engine
    options = {f"{OPTION_PREFIX}{key}": value for key, value in sorted(engine.options.items())}
    return {"engine_kind": engine.kind, "precision": engine.precision, "threads": engine.threads, **options}


def _text_limits(settings: Settings, spec: ServingSpec) -> dict[str, object]:
    tokenizer = settings.tokenizer
    return {
        "max_tokens": spec.max_tokens,
        "pad_token_id": spec.pad_token_id,
        "max_text_bytes": tokenizer.max_text_bytes,
        "max_request_bytes": tokenizer.max_request_bytes,
    }


def _text_warmup(spec: ServingSpec, max_batch_size: int) -> list[mc.ModelWarmup]:
    """Warm-up requests of 1 and 8 rows, each input read from the model folder's warmup/ file of its name."""
    names = (QUERY_INPUT, TEXT_INPUT) if spec.pairs else (TEXT_INPUT,)
    inputs = {name: mc.ModelWarmup.Input(data_type=mc.TYPE_STRING, dims=[1], input_data_file=name) for name in names}
    return [
        mc.ModelWarmup(name=f"text_batch_{size}", batch_size=size, inputs=inputs)
        for size in sorted({1, min(8, max_batch_size)})
    ]


def _task_outputs(spec: ServingSpec) -> list[mc.ModelOutput]:
    """What clients get back from the ensemble, whatever the topology: the task's outputs and each text's
    token count (what usage.prompt_tokens of the OpenAI front reports)."""
    tokens = _tensor(mc.ModelOutput, TOKENS_OUTPUT, mc.TYPE_INT32, [1])
    if spec.pairs:
        return [_tensor(mc.ModelOutput, SCORE_OUTPUT, mc.TYPE_FP32, [1]), tokens]
    sparse = [  # per request [texts, its most non-zero entries], padded (common/contract.py)
        _tensor(mc.ModelOutput, SPARSE_INDICES, mc.TYPE_INT32, [-1]),
        _tensor(mc.ModelOutput, SPARSE_VALUES, mc.TYPE_FP32, [-1]),
    ]
    if spec.task == "sparse":
        return [*sparse, tokens]
    dim = (spec.hybrid or {}).get("colbert_size", spec.output_size)
    multi_vector = [  # per request [its kept tokens, dim], packed: the batch axis counts tokens, not texts
        _tensor(mc.ModelOutput, TOKEN_VECTORS, mc.TYPE_FP16, [dim]),
        _tensor(mc.ModelOutput, TOKEN_VECTORS_FP32, mc.TYPE_FP32, [dim]),
        _tensor(mc.ModelOutput, TOKEN_COUNTS, mc.TYPE_INT32, [1]),
    ]
    if spec.task == "multi_vector":
        return [*multi_vector, tokens]
    if spec.task == "classification":
        return [
            _tensor(mc.ModelOutput, "label", mc.TYPE_STRING, [1]),
            _tensor(mc.ModelOutput, "scores", mc.TYPE_FP32, [spec.output_size]),
            tokens,
        ]
    dense = _tensor(mc.ModelOutput, "embedding", mc.TYPE_FP32, [spec.output_size])
    if spec.task == "hybrid":  # each request gets those it asks for
        return [dense, *sparse, *multi_vector, tokens]
    return [dense, tokens]


def _late_chunk_outputs(spec: ServingSpec) -> list[mc.ModelOutput]:
    """An embedder's late chunks (stages/late_chunking.py), which the one-stage model alone answers."""
    if spec.task != "embedding":
        return []
    return [
        _tensor(mc.ModelOutput, CHUNK_EMBEDDINGS, mc.TYPE_FP32, [spec.output_size]),  # packed [chunks, dim]
        _tensor(mc.ModelOutput, CHUNK_COUNTS, mc.TYPE_INT32, [1]),
    ]


def _sparse(settings: Settings) -> dict[str, object]:
    """A sparse model's defaults for what each text's answer keeps (a request's parameters override them)."""
    if settings.model.task not in ("sparse", "hybrid"):
        return {}
    return {SPARSE_TOP_K: settings.sparse.top_k, SPARSE_THRESHOLD: settings.sparse.threshold}


def one_stage_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    """The one-stage model, under the name clients call (`ensemble`, or with several models its own name): text
    (and a reranker's query) in, the task's outputs out.

    Instances, GPUs, queue delay and bounds come from [encoder], its batch limit from [ensemble]: it is at once
    the most texts one request may carry and the most one execute() runs. A one-step Triton ensemble in front
    would keep the two limits apart, but it cost 30 us of tritonserver CPU per request and 3-5 % throughput
    on the H200 (docs/data-path.md, one stage or two)."""
    # Beside a query lane the model's own stubs lower their CPU priority (priority.ingestion_nice).
    nice = {"nice": settings.priority.ingestion_nice} if names.query_lane and settings.priority.ingestion_nice else {}
    parameters = {
        **_text_limits(settings, spec), **_engine_parameters(settings), **_sparse(settings), **nice,
        **_gpu_turns(settings, names),
    }  # fmt: skip
    config = _python_stage(
        names.model,
        settings.encoder,
        input=_text_inputs(spec),
        output=[*_task_outputs(spec), *_late_chunk_outputs(spec)],
        parameters=_parameters(parameters),
        model_warmup=_text_warmup(spec, settings.ensemble.max_batch_size),
    )
    config.max_batch_size = settings.ensemble.max_batch_size
    return config


def _gpu_turns(settings: Settings, names: ServedNames) -> dict:
    """Beside a query lane on GPUs, the stubs take turns on each GPU (stages/gpu_turns.py), as the model's side
    (query_lane_config makes its copy the lane's). The chunk bound goes with any lane: an engine process shared by
    the stubs (engines/engine_process.py) bounds its ingestion batches by it while queries come, on any device."""
    if not names.query_lane:
        return {}
    priority = settings.priority
    chunk = {"ingestion_chunk_texts": priority.ingestion_chunk_texts}
    if not settings.encoder.gpus:
        return chunk
    return {**chunk, "gpu_turns": "model", "ingestion_on_gpu": priority.ingestion_on_gpu,
            "query_yield_ms": priority.query_yield_ms}  # fmt: skip


def query_lane_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    """The one-stage model again as its query lane: the same stage and files under names.query_lane, with
    priority.query_instances of its own, so that a query waits for queries only, never for an ingestion batch.
    Triton 2.51's own priority_levels would order one queue, but they stall its dynamic batcher whenever the next
    request does not fit the batch (docs/reliability.md, Priority)."""
    config = one_stage_config(settings, spec, names)
    config.name = names.query_lane
    config.parameters.pop("nice", None)
    config.parameters["query_lane"].string_value = "true"  # its stubs' calls are queries (engines/shared.py)
    if "gpu_turns" in config.parameters:  # the same turns, as the lane's side (stages/gpu_turns.py)
        config.parameters["gpu_turns"].string_value = "lane"
    gpus = list(settings.encoder.gpus)
    kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
    del config.instance_group[:]
    config.instance_group.append(mc.ModelInstanceGroup(kind=kind, count=settings.priority.query_instances, gpus=gpus))
    return config


def encoder_config(settings: Settings, spec: ServingSpec, names: ServedNames, warmup_tokens: int) -> mc.ModelConfig:
    stage = settings.encoder
    ragged = {"allow_ragged_batch": True}
    warmup_inputs = {
        name: mc.ModelWarmup.Input(data_type=mc.TYPE_INT32, dims=[warmup_tokens], input_data_file=name)
        for name in spec.engine_inputs
    }
    return _python_stage(
        names.encoder,
        stage,
        input=[_tensor(mc.ModelInput, name, mc.TYPE_INT32, [-1], **ragged) for name in spec.engine_inputs],
        output=[_tensor(mc.ModelOutput, spec.output_name, mc.TYPE_FP32, [spec.output_size])],
        parameters=_parameters(_engine_parameters(settings)),
        model_warmup=[
            mc.ModelWarmup(name=f"tokens_batch_{size}", batch_size=size, inputs=warmup_inputs)
            for size in sorted({1, min(8, stage.max_batch_size)})
        ],
    )


def tensorrt_encoder_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    """The encoder as a `tensorrt_plan` model: one profile per bucket, CUDA graphs per bucket and batch."""

    stage, trt = settings.encoder, settings.tensorrt
    plan_profiles = profiles(settings)
    graphs = []
    for length in trt.sequence_buckets if trt.cuda_graphs else ():
        previous = 0
        for batch in graph_batches(settings, length):
            dims = mc.ModelOptimizationPolicy.Cuda.GraphSpec.Shape(dim=[length])
            shape = {name: dims for name in spec.engine_inputs}
            graphs.append(
                mc.ModelOptimizationPolicy.Cuda.GraphSpec(
                    batch_size=batch,
                    input=shape,
                    graph_lower_bound=mc.ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound(
                        batch_size=previous + 1, input=shape
                    ),
                )
            )
            previous = batch
    return mc.ModelConfig(
        name=names.encoder,
        platform="tensorrt_plan",
        default_model_filename="model.plan",
        max_batch_size=stage.max_batch_size,
        input=[_tensor(mc.ModelInput, name, mc.TYPE_INT32, [-1]) for name in spec.engine_inputs],
        output=[_tensor(mc.ModelOutput, spec.output_name, mc.TYPE_FP32, [spec.output_size])],
        dynamic_batching=_batching(
            stage, list(stage.preferred_batch_sizes) or sorted({p["opt"][0] for p in plan_profiles})
        ),
        # Every instance may use every profile: Triton's scheduler does not route requests by shape, so an
        # instance pinned to one profile would fail requests of other lengths.
        instance_group=[
            mc.ModelInstanceGroup(
                kind=mc.ModelInstanceGroup.KIND_GPU,
                count=stage.instances,
                gpus=list(stage.gpus),
                profile=[str(i) for i in range(len(plan_profiles))],
            )
        ],
        optimization=mc.ModelOptimizationPolicy(
            cuda=mc.ModelOptimizationPolicy.Cuda(graphs=trt.cuda_graphs, graph_spec=graphs)
        ),
    )


def postprocess_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    return _python_stage(
        names.postprocess,
        settings.postprocess,
        input=[_tensor(mc.ModelInput, "logits", mc.TYPE_FP32, [spec.output_size])],
        output=[
            _tensor(mc.ModelOutput, "scores", mc.TYPE_FP32, [spec.output_size]),
            _tensor(mc.ModelOutput, "label", mc.TYPE_STRING, [1]),
        ],
    )


def ensemble_config(settings: Settings, spec: ServingSpec, names: ServedNames) -> mc.ModelConfig:
    """The two-stage ensemble clients call: text (and a reranker's query) in, the task's outputs out."""
    step = mc.ModelEnsembling.Step
    text_inputs = [tensor.name for tensor in _text_inputs(spec)]
    steps = [
        step(
            model_name=names.tokenizer,
            model_version=-1,
            input_map={name: name for name in text_inputs},
            output_map={name: name for name in (*spec.engine_inputs, TOKENS_OUTPUT)},
        ),
        step(
            model_name=names.encoder,
            model_version=-1,
            input_map={name: name for name in spec.engine_inputs},
            # A reranker's one logit is its score.
            output_map={spec.output_name: SCORE_OUTPUT if spec.pairs else spec.output_name},
        ),
    ]
    if spec.task == "classification":
        steps.append(
            step(
                model_name=names.postprocess,
                model_version=-1,
                input_map={"logits": "logits"},
                output_map={"scores": "scores", "label": "label"},
            )
        )
    return mc.ModelConfig(
        name=names.model,
        platform="ensemble",
        max_batch_size=settings.ensemble.max_batch_size,
        input=_text_inputs(spec),
        output=_task_outputs(spec),
        ensemble_scheduling=mc.ModelEnsembling(step=steps),
    )


def python_models(settings: Settings, names: ServedNames) -> list[str]:
    """The Triton models one settings file's model runs as Python stubs, in data-path order."""
    if settings.topology == "one_stage":
        return [names.model, *([names.query_lane] if names.query_lane else [])]
    models = [names.tokenizer] + ([names.encoder] if settings.engine.kind != "tensorrt" else [])
    return models + ([names.postprocess] if settings.model.task == "classification" else [])
