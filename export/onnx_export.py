"""ONNX export of encoder + task head, and its validation against PyTorch on real sentences."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

from common.contract import TOKEN_TYPES, TOKEN_VECTORS, TOKEN_WEIGHTS, ServingSpec
from common.padding import pad_sequences
from export.checkpoint import Pooling
from model_repository.stages.engines.models import architecture

PER_TOKEN = ("token_states", TOKEN_WEIGHTS, TOKEN_VECTORS)  # graph outputs of a row per token
VALIDATION_SENTENCES = Path(__file__).with_name("validation_sentences.txt")


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """sentence-transformers pooling over each sequence's own tokens (mask: 1 real, 0 padding)."""
    mask_f = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling.mode == "cls":
        pooled = hidden[:, 0]
    elif pooling.mode == "max":
        pooled = hidden.masked_fill(mask_f == 0, -1e9).max(dim=1).values
    else:
        summed = (hidden * mask_f).sum(dim=1)
        counts = mask_f.sum(dim=1).clamp(min=1e-9)
        pooled = summed / (counts.sqrt() if pooling.mode == "mean_sqrt_len" else counts)
    return F.normalize(pooled, p=2, dim=1) if pooling.normalize else pooled


class ServingModule(nn.Module):
    """What the encoder stage serves: token ids and mask (and a BERT pair's token types) in, one row per sequence
    out: the pooled embedding, the classifier's logits, or a reranker's first logit."""

    def __init__(self, model: nn.Module, task: str, pooling: Pooling, token_types: bool) -> None:
        super().__init__()
        self.model, self.task, self.pooling = model, task, pooling
        self.token_types = token_types  # the model reads them; the others' forward has no such argument
        # Where positions start (RoBERTa's family, MPNet: after the padding id). transformers derives them from the
        # ids with a cumulative sum, an int32 CumSum TensorRT's ONNX parser does not list; rows padded on the right
        # have them from the mask alone.
        config = model.config
        self.first_position = architecture(config.model_type).first_position(config.to_dict())

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_types:
            inputs["token_type_ids"] = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        if self.first_position:  # a real token at i reads first + i, padding the padding id's row (first - 1)
            places = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)[None, :]
            inputs["position_ids"] = places * attention_mask.long() + (self.first_position - 1)
        out = self.model(**inputs)
        # The head and pooling run in fp32 whatever the encoder's precision: outputs are always float32.
        if self.task == "rerank":
            return out.logits[:, :1].float()
        if self.task == "classification":
            return out.logits.float()
        return pool(out.last_hidden_state.float(), attention_mask, self.pooling)


def export_onnx(module: ServingModule, path: Path, spec: ServingSpec, opset: int) -> None:
    # Any ids inside every vocabulary but the padding id: a real row and a padded one.
    a, b, c, d = [i for i in range(2, 7) if i != spec.pad_token_id][:4]
    ids = torch.tensor([[a, b, c, d], [a, c, d, spec.pad_token_id]], dtype=torch.int32)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.int32)
    types = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.int32)
    example = (ids, mask, types) if TOKEN_TYPES in spec.engine_inputs else (ids, mask)
    names = list(spec.engine_inputs)
    per_token = {0: "batch", 1: "sequence"}
    axes = {name: per_token for name in names}
    # The tracer warns about shape-dependent Python branches in transformers' masking code; validate()
    # runs the exported graph on other batch and sequence sizes, which is the check that matters.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index")
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=names,
            output_names=list(spec.graph_outputs),
            # A sparse or multi-vector graph gives a row per token (a hybrid one: its dense vectors a row per
            # sequence, the rest a row per token), the others a row per sequence.
            dynamic_axes={
                **axes,
                **{name: per_token if name in PER_TOKEN else {0: "batch"} for name in spec.graph_outputs},
            },
            opset_version=opset,
            dynamo=False,
        )


def onnx_session(onnx_path: Path) -> ort.InferenceSession:
    """ONNX Runtime on the CPU, for the validation beside PyTorch."""
    options = ort.SessionOptions()
    # Spinning threads left behind by the run would take the cores from PyTorch's reference (1.6x slower, 2 cores).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class Deviation:
    """How far ONNX Runtime's outputs are from PyTorch's, absolutely and at the scale of the outputs."""

    max_abs_diff: float
    largest_output: float  # the reference's largest magnitude: a unit vector's largest component, a top score

    @property
    def relative(self) -> float:
        """max_abs_diff over the largest output: fp32 noise grows with the outputs (logits of +-10 moved by 1.1e-4
        where unit vectors move by ~1e-7), and a wrong graph moves them by a share of their size."""
        return self.max_abs_diff / max(self.largest_output, np.finfo(np.float32).tiny)


def validate(
    module: ServingModule,
    onnx_path: Path,
    sequences: list[np.ndarray],
    pad_id: int,
    types: list[np.ndarray] | None = None,
) -> Deviation:
    """ONNX Runtime on one padded batch against PyTorch on each sequence alone (a pair's token types beside its
    ids, where the graph takes them).

    Comparing against unpadded single-sequence runs also proves that padding does not leak into pooling.
    """
    session = onnx_session(onnx_path)
    ids, mask = pad_sequences(sequences, pad_id)
    feeds = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        feeds[TOKEN_TYPES] = pad_sequences(types, 0)[0]
    (onnx_out,) = session.run(None, feeds)
    with torch.no_grad():
        rows = []
        for index, sequence in enumerate(sequences):
            single = torch.from_numpy(sequence[None])
            extra = () if types is None else (torch.from_numpy(types[index][None]),)
            rows.append(module(single, torch.ones((1, len(sequence)), dtype=torch.int32), *extra))
        reference = torch.cat(rows).numpy()
    return Deviation(float(np.abs(onnx_out - reference).max()), float(np.abs(reference).max()))
