"""Triton Python model `tokenizer`: text -> token ids + attention mask.

The whole dynamic batch (every text of every request) is encoded in one call to the Rust fast tokenizer,
which spreads it over threads; of a long text only a prefix is tokenized (tokenization.encode_truncated).
A text over max_text_bytes fails its request with INVALID_ARG before it is decoded. Each request's rows are
padded only to that request's longest text; the encoder strips the padding again using the mask.

Custom metrics on Triton's metrics port (labels model, version, model_instance), three updates per execute():
  bert_tokenizer_requests_total       requests tokenized
  bert_tokenizer_tokens_total         tokens after truncation, special tokens included (per request: divide
                                      by bert_tokenizer_requests_total)
  bert_tokenizer_texts_per_execute    histogram of texts encoded per execute() call (the dynamic batch)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import triton_python_backend_utils as pb_utils
from padding import pad_sequences
from stage_metrics import StageMetrics, power_of_two_buckets
from tokenization import encode_truncated, load_tokenizer


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
        self.max_text_bytes = int(params["max_text_bytes"])
        self.max_request_bytes = int(params["max_request_bytes"])
        self.buckets = [int(b) for b in params.get("pad_to_buckets", "").split(",") if b]
        self._create_metrics(args, int(config["max_batch_size"]))

    def _create_metrics(self, args: dict, max_batch_size: int) -> None:
        self._metrics = StageMetrics(
            pb_utils,
            "tokenizer",
            args,
            {
                "bert_tokenizer_requests_total": ("Requests tokenized", "counter", None),
                "bert_tokenizer_tokens_total": (
                    "Tokens produced after truncation, special tokens included",
                    "counter",
                    None,
                ),
                "bert_tokenizer_texts_per_execute": (
                    "Texts encoded per execute() call",
                    "histogram",
                    power_of_two_buckets(max_batch_size),
                ),
            },
        )

    def _record(self, requests: int, encodings: list) -> None:
        values = {"bert_tokenizer_requests_total": requests}
        if encodings:
            values["bert_tokenizer_tokens_total"] = sum(map(len, encodings))
            values["bert_tokenizer_texts_per_execute"] = len(encodings)
        self._metrics.update(values)

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
        encodings = encode_truncated(self.tokenizer, texts) if texts else []
        self._record(len(requests), encodings)
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

    def finalize(self) -> None:
        self._metrics.close()

    def _texts(self, request) -> list[str]:
        raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
        if raw.size == 0:
            raise ValueError("text: the batch holds no texts")
        sizes = [len(item) if isinstance(item, bytes) else len(str(item).encode()) for item in raw]
        if sum(sizes) > self.max_request_bytes:
            raise ValueError(
                f"the request's {len(sizes)} texts are {sum(sizes)} bytes together, over the limit of "
                f"{self.max_request_bytes} (tokenizer.max_request_bytes)"
            )
        texts, limit = [], self.max_text_bytes
        for index, item in enumerate(raw):
            # Before any decoding: bounds what one text costs, also where the prefix fast path cannot help.
            size = sizes[index]
            if size > limit:
                raise ValueError(f"text[{index}] is {size} bytes, over the limit of {limit} (tokenizer.max_text_bytes)")
            if isinstance(item, bytes):
                try:
                    item = item.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"text[{index}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            texts.append(str(item))
        return texts
