"""ONNX export of encoder + task head, and its validation against PyTorch on real sentences."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

from common.contract import ENGINE_INPUTS
from common.padding import pad_sequences
from export.checkpoint import Pooling

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
    """What the encoder stage serves: token ids and mask in, one row per sequence out."""

    def __init__(self, model: nn.Module, task: str, pooling: Pooling) -> None:
        super().__init__()
        self.model, self.task, self.pooling = model, task, pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        token_type_ids = torch.zeros_like(input_ids)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        # The head and pooling run in fp32 whatever the encoder's precision: outputs are always float32.
        if self.task == "classification":
            return out.logits.float()
        return pool(out.last_hidden_state.float(), attention_mask, self.pooling)


def export_onnx(module: ServingModule, path: Path, output_name: str, opset: int) -> None:
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2088, 102, 0]], dtype=torch.int32)
    mask = (ids != 0).to(torch.int32)
    axes = {name: {0: "batch", 1: "sequence"} for name in ENGINE_INPUTS}
    # The tracer warns about shape-dependent Python branches in transformers' masking code; validate()
    # runs the exported graph on other batch and sequence sizes, which is the check that matters.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index")
        torch.onnx.export(
            module,
            (ids, mask),
            str(path),
            input_names=list(ENGINE_INPUTS),
            output_names=[output_name],
            dynamic_axes={**axes, output_name: {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )


def validate(module: ServingModule, onnx_path: Path, sequences: list[np.ndarray], pad_id: int) -> float:
    """Max abs diff between ONNX Runtime on one padded batch and PyTorch on each sequence alone.

    Comparing against unpadded single-sequence runs also proves that padding does not leak into pooling.
    """
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ids, mask = pad_sequences(sequences, pad_id)
    (onnx_out,) = session.run(None, dict(zip(ENGINE_INPUTS, (ids, mask), strict=True)))
    with torch.no_grad():
        reference = torch.cat(
            [module(torch.from_numpy(s[None]), torch.ones((1, len(s)), dtype=torch.int32)) for s in sequences]
        ).numpy()
    return float(np.abs(onnx_out - reference).max())
