"""sentence-transformers' prompts in the stage: the text put before each of a request's texts, as encode() puts it.

A request names a prompt by its KServe parameter prompt_name ("" for none); one that names none is read with the
model's default prompt (its default_prompt_name), as encode() reads a text given no prompt. A model without prompts
costs nothing here: no request's parameters are read.
"""

from __future__ import annotations

import json

from common.contract import PROMPT_PARAMETER, ServingSpec


class Prompts:
    def __init__(self, spec: ServingSpec) -> None:
        self.prompts = dict(spec.prompts or {})
        self.default = self.prompts.get(spec.default_prompt_name, "") if spec.default_prompt_name else ""

    def of(self, requests: list) -> list[str | ValueError] | None:
        """Each request's prompt (prefix), from its parameters(); None for a model without prompts."""
        return [self.prefix(request.parameters()) for request in requests] if self.prompts else None

    def prefix(self, parameters: str) -> str | ValueError:
        """The prompt a request's texts are read with, or the error naming a prompt the model does not have."""
        name = json.loads(parameters or "{}").get(PROMPT_PARAMETER)
        if name is None:
            return self.default
        if name == "":
            return ""
        if not isinstance(name, str) or name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            return ValueError(f"parameter {PROMPT_PARAMETER} {name!r} is not one of the model's prompts ({known})")
        return self.prompts[name]
