"""Triton Python model `tokenizer`: text -> token ids + attention mask.

The whole dynamic batch (every text of every request) is encoded in one call to the Rust fast tokenizer,
which spreads it over threads. Each request's rows are padded only to that request's longest text; the
encoder strips the padding again using the mask.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import triton_python_backend_utils as pb_utils
from padding import pad_sequences
from tokenization import load_tokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        if sum(group["count"] for group in config["instance_group"]) > 1:
            # Parallelism then comes from the instances; a thread pool per instance would oversubscribe the cores.
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.tokenizer = load_tokenizer(version_dir / "tokenizer.json", int(params["max_tokens"]))
        self.pad_id = int(params["pad_token_id"])
        self.buckets = [int(b) for b in params.get("pad_to_buckets", "").split(",") if b]

    def execute(self, requests: list) -> list:
        texts: list[str] = []
        spans: list[tuple[int, int] | pb_utils.TritonError] = []
        for request in requests:
            try:
                decoded = self._texts(request)
            except ValueError as exc:
                spans.append(pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
                continue
            spans.append((len(texts), len(texts) + len(decoded)))
            texts.extend(decoded)
        encodings = self.tokenizer.encode_batch(texts) if texts else []
        responses = []
        for span in spans:
            if isinstance(span, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(error=span))
                continue
            ids, mask = pad_sequences([encodings[i].ids for i in range(*span)], self.pad_id, self.buckets)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)])
            )
        return responses

    @staticmethod
    def _texts(request) -> list[str]:
        raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
        if raw.size == 0:
            raise ValueError("text: the batch holds no texts")
        texts = []
        for index, item in enumerate(raw):
            if isinstance(item, bytes):
                try:
                    item = item.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"text[{index}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            texts.append(str(item))
        return texts
