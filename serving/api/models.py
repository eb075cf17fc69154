"""The models the API front serves, as the settings files and the generated repository describe them, and which
one a request means: by the name it gives (OpenAI, Cohere), or the first model of the task a route serves (TEI,
whose clients name no model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from common.contract import SERVING_FILE, ServingSpec
from common.hf_tokenizer import load_tokenizer
from serving.api.quantization import CALIBRATED, Calibration
from serving.api.schema import ApiError, Limits
from settings import Deployment, Settings

# What each task's model is called, and the routes to use for it, for the error that names them.
NOUNS = {
    "embedding": "an embedding model",
    "classification": "a classification model",
    "rerank": "a reranker",
    "sparse": "a sparse embedding model",
    "multi_vector": "a multi-vector (ColBERT) model",
    "hybrid": "a hybrid (BGE-M3) model",
}
ROUTES = {
    "embedding": "POST /v1/embeddings, /v2/embed or /embed",
    "classification": "POST /predict",
    "rerank": "POST /rerank or /v2/rerank",
    "sparse": "POST /embed_sparse",
    "multi_vector": "POST /embed_all or /colbert/score",
    "hybrid": "POST /encode, /v1/embeddings, /embed_sparse or /embed_all",
}
HYBRID_SERVES = ("embedding", "sparse", "multi_vector")  # a hybrid model's outputs: the routes of these tasks take it


@dataclass(frozen=True)
class ServedModel:
    name: str  # model.name: what callers name it
    triton: str  # the Triton model the front calls (`ensemble` on a one-model server)
    settings: Settings
    spec: ServingSpec
    tokenizer: Tokenizer  # truncating to max_tokens, as the stages do
    whole: Tokenizer  # the same without truncation: token counts, left truncation
    limits: Limits
    prompts: dict[str, str]  # sentence-transformers' prompts by name (TEI's prompt_name)
    calibration: Calibration | None  # an embedder's int8/uint8 calibration from its export; None if it has none
    query_lane: str = ""  # the Triton model queries go to while ingestion runs ([priority]); "" when it has none

    @property
    def task(self) -> str:
        return self.spec.task

    def prompt(self, name: str | None) -> str:
        """The prompt a request names (TEI's prompt_name), or the model's default prompt where it names none, as
        sentence-transformers' encode() reads it; 400 naming the model's prompts for one it does not have."""
        if name is None:
            default = self.spec.default_prompt_name
            return self.prompts.get(default, "") if default else ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise ApiError(400, f"'prompt_name' {name!r} is not one of the model's prompts ({known})", "prompt_name")
        return self.prompts[name]

    @property
    def max_tokens(self) -> int:
        """The tokens a text is cut to: the export's (the checkpoint's own limit, or model.max_tokens)."""
        return self.spec.max_tokens

    @property
    def max_texts(self) -> int:
        return self.settings.ensemble.max_batch_size

    @property
    def max_bytes(self) -> int:
        return self.settings.tokenizer.max_request_bytes

    def ranges_for(self, kinds: tuple[str, ...], param: str, dimensions: int | None) -> np.ndarray | None:
        """The ranges of rows cut to `dimensions` (None: the full width), where int8 or uint8 is asked for; 400
        naming the kind when the export has no calibration."""
        calibrated = [kind for kind in kinds if kind in CALIBRATED]
        if not calibrated:
            return None
        if self.calibration is None:
            message = (
                f"{self.name} has no calibrated ranges for {calibrated[0]} (its export predates them): export it again"
            )
            raise ApiError(400, message, param)
        return self.calibration.ranges(dimensions or self.spec.output_size)

    def serves(self, task: str) -> bool:
        """Whether the routes of the task take this model: its own task's, and a hybrid model's three."""
        return task == self.task or (self.task == "hybrid" and task in HYBRID_SERVES)

    def refuse_task(self, wanted: str) -> ApiError:
        message = f"{self.name} is {NOUNS[self.task]}, not {NOUNS[wanted]}: use {ROUTES[self.task]}"
        return ApiError(400, message, "model")


def served_model(deployment: Deployment, settings: Settings, repository: Path) -> ServedModel:
    """One model as the repository holds it: serving.json, tokenizer.json and an embedder's calibration.npy beside
    the stage that tokenizes."""
    names = deployment.names(settings)
    folder = repository / (names.model if settings.topology == "one_stage" else names.tokenizer) / "1"
    if not (folder / SERVING_FILE).is_file():
        raise SystemExit(f"{folder} holds no {SERVING_FILE}: run `make repo` for these settings first")
    spec = ServingSpec.load(folder)
    tokenizer = load_tokenizer(folder / "tokenizer.json", spec.max_tokens)
    whole = Tokenizer.from_str(tokenizer.to_str())
    whole.no_truncation()
    prompts = dict(spec.prompts or {})
    limits = Limits(deployment.api.max_inputs, settings.tokenizer.max_text_bytes, spec.output_size)
    calibration = Calibration.load(folder)
    lane = names.lane_in(repository)
    return ServedModel(
        settings.model.name, names.model, settings, spec, tokenizer, whole, limits, prompts, calibration, lane
    )


class Models:
    """Every served model, in the settings files' order."""

    def __init__(self, models: list[ServedModel]) -> None:
        self.all = models

    @classmethod
    def load(cls, deployment: Deployment, repository: Path) -> Models:
        return cls([served_model(deployment, settings, repository) for settings in deployment.models])

    @property
    def first(self) -> ServedModel:
        return self.all[0]

    def named(self, name: str | None, task: str, param: str = "model") -> ServedModel:
        """The model a request names (None: the first of the task); 404 naming the served ones, 400 if it is
        another task's."""
        if name is None:
            return self.for_task(task)
        if not isinstance(name, str):
            raise ApiError(400, f"'{param}' must be a string", param)
        found = next((model for model in self.all if model.name == name), None)
        if found is None:
            served = ", ".join(repr(model.name) for model in self.all)
            raise ApiError(
                404, f"the model {name!r} does not exist; this server serves {served}", param, "model_not_found"
            )
        if not found.serves(task):
            raise found.refuse_task(task)
        return found

    def for_task(self, task: str) -> ServedModel:
        """The first model of the task (TEI's routes name no model); 400 naming what is served instead."""
        found = next((model for model in self.all if model.serves(task)), None)
        if found is None:
            if len(self.all) == 1:
                raise self.first.refuse_task(task)
            served = ", ".join(f"{model.name} ({model.task})" for model in self.all)
            raise ApiError(400, f"this server serves no {task} model: {served}", "model")
        return found
