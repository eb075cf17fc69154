"""What a Python stage reads from the arguments Triton passes to initialize(), in one place: its config, its
parameters, its version folder, and the engine they name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from common.contract import OPTION_PREFIX, ServingSpec
from common.engine_choice import choose_engine, shares_engine_process

from .engines import Engine, load_engine


def model_config(args: dict) -> tuple[dict, dict[str, str], Path]:
    """(config, its string parameters, the version folder) of the model instance being initialized."""
    config = json.loads(args["model_config"])
    params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
    return config, params, Path(args["model_repository"]) / args["model_version"]


def instance_count(config: dict) -> int:
    return sum(group["count"] for group in config["instance_group"])


def engine_from_args(args: dict, params: dict, log: Callable[[str], None]) -> Engine:
    """The engine a stage instance runs: kind and options from its config's parameters (engine_kind, precision,
    threads, and the settings' [engine] options as "engine.<name>"), device from the instance; "auto" kind or
    precision decided here for the task of the version's serving.json (common/engine_choice.py) and the choice said
    through `log`."""
    device = "cpu"
    if args["model_instance_kind"] == "GPU":
        device = f"cuda:{args['model_instance_device_id']}"
    version_dir = Path(args["model_repository"]) / args["model_version"]
    spec = ServingSpec.load(version_dir)
    choice = choose_engine(params["engine_kind"], params.get("precision", "auto"), device != "cpu", spec.task)
    log(f"{args['model_instance_name']}: {choice.describe()}")
    options = {"precision": choice.precision}
    if "threads" in params:
        options["threads"] = params["threads"]
    options.update(
        {key.removeprefix(OPTION_PREFIX): value for key, value in params.items() if key.startswith(OPTION_PREFIX)}
    )
    shared_process = shares_engine_process(options)
    options.pop("shared_process", None)  # the stage's option, not the engine's
    if shared_process:  # one engine process a device
        from .engines.shared import SharedEngine

        lane = {"query": params.get("query_lane") == "true", "chunk_texts": params.get("ingestion_chunk_texts", 0)}
        shared = {**options, "inner_kind": choice.kind, **lane}
        engine = SharedEngine(version_dir, spec, device, shared)
        log(f"{args['model_instance_name']}: shares the engine process at {engine.socket_path}")
        return engine
    return load_engine(choice.kind, version_dir, device, options)
