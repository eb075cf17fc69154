"""What a Python stage reads from the arguments Triton passes to initialize(), in one place."""

from __future__ import annotations

import json
from pathlib import Path


def model_config(args: dict) -> tuple[dict, dict[str, str], Path]:
    """(config, its string parameters, the version folder) of the model instance being initialized."""
    config = json.loads(args["model_config"])
    params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
    return config, params, Path(args["model_repository"]) / args["model_version"]


def instance_count(config: dict) -> int:
    return sum(group["count"] for group in config["instance_group"])
