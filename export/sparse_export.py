"""Task sparse at export (SPLADE, OpenSearch's neural-sparse doc models): what the checkpoint's SparseEncoder
modules say, the graph ONNX Runtime serves, the MLM decoder the engine projects with, and the check that the two
together give what the masked-LM model and SpladePooling give.

The graph stops at each token's MLM-transformed state (dense, activation, LayerNorm: [batch, sequence, hidden]);
onnxruntime_cpu projects it onto the vocabulary and pools it a chunk at a time (engines/sparse.py), since the
whole [tokens x vocabulary] logits of a batch would take gigabytes. The torch engine reads the same head from the
checkpoint's weights (engines/torch_sparse.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from common.contract import SPARSE_HEAD_FILE, STATIC_QUERY_FILE, ServingSpec
from common.padding import pad_sequences
from export.checkpoint import CheckpointError
from export.onnx_export import Deviation, onnx_session
from export.st_modules import Module
from model_repository.stages.engines.sparse import NumpySparseHead

SPARSE_FAMILIES = ("bert", "distilbert")  # masked-LM heads the torch engine's families load (models/)


def check_sparse_family(task: str, model_type: str) -> None:
    """Task sparse is served for the families whose masked-LM head the torch engine loads."""
    if task == "sparse" and model_type not in SPARSE_FAMILIES:
        families = ", ".join(SPARSE_FAMILIES)
        raise CheckpointError(f"task sparse is served for masked-LM checkpoints of {families}, not {model_type}")


def save_static_query(module: Module, out_dir: Path) -> None:
    """An inference-free SparseEncoder's query side: SparseStaticEmbedding's weight per vocabulary id (float32),
    which the stage gives each distinct token of a query (no special tokens), without the engine."""
    from safetensors.numpy import load_file

    if (module.folder / "model.safetensors").is_file():
        weight = load_file(module.folder / "model.safetensors")["weight"]
    else:
        weight = torch.load(module.folder / "pytorch_model.bin", map_location="cpu", weights_only=True)[
            "weight"
        ].numpy()
    np.save(out_dir / STATIC_QUERY_FILE, weight.astype(np.float32))


def mlm_transform(model: PreTrainedModel) -> nn.Module:
    """The MLM head before its decoder: dense, activation, LayerNorm (a family of SPARSE_FAMILIES)."""
    if model.config.model_type == "bert":
        return model.cls.predictions.transform
    return nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm)  # distilbert


class SparseStates(nn.Module):
    """What the sparse graph serves: ids and mask in, each token's MLM-transformed state out (fp32)."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.encoder, self.transform = model.base_model, mlm_transform(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.transform(hidden).float()


def save_head(model: PreTrainedModel, out_dir: Path) -> None:
    """The decoder (tied to the word embeddings) and its bias, for onnxruntime_cpu."""
    decoder = model.get_output_embeddings()
    weight, bias = (tensor.detach().float().numpy() for tensor in (decoder.weight, decoder.bias))
    np.savez(out_dir / SPARSE_HEAD_FILE, weight=weight, bias=bias)


def splade(model: PreTrainedModel, sequence: np.ndarray, activation: str) -> np.ndarray:
    """SpladePooling of one sequence as sentence-transformers computes it: the whole logits, log1p(relu), max."""
    ids = torch.from_numpy(sequence[None])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    weights = torch.log1p(torch.relu(logits))
    weights = torch.log1p(weights) if activation == "log1p_relu" else weights
    return weights.max(dim=0).values.numpy()


def validate_sparse(
    model: PreTrainedModel, onnx_path: Path, out_dir: Path, sequences: list[np.ndarray], spec: ServingSpec
) -> Deviation:
    """The graph on one padded batch and the engine's numpy head against the masked-LM model on each sequence
    alone: every vocabulary weight."""
    ids, mask = pad_sequences(sequences, spec.pad_token_id)
    (states,) = onnx_session(onnx_path).run(None, {"input_ids": ids, "attention_mask": mask})
    lengths = np.array([len(sequence) for sequence in sequences])
    rows = NumpySparseHead(out_dir, spec.activation)(states[mask.astype(bool)], lengths)
    served = np.zeros((len(sequences), spec.output_size), dtype=np.float32)
    for dense, row in zip(served, rows, strict=True):
        dense[row.indices] = row.values
    reference = np.stack([splade(model, sequence, spec.activation) for sequence in sequences])
    return Deviation(float(np.abs(served - reference).max()), float(np.abs(reference).max()))
