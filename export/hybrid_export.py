"""Task hybrid at export (BGE-M3, FlagEmbedding's BGEM3FlagModel): an XLM-RoBERTa encoder and two heads saved beside
its weights, sparse_linear.pt (hidden -> 1) and colbert_linear.pt (hidden -> colbert dim), read here; one pass
gives all three of BGEM3FlagModel.encode's outputs:
  dense        the first token's last hidden state, L2-normalized;
  lexical      each token's weight ReLU(sparse_linear(h)); a text's weight of token id v is the largest of its
               tokens of id v, BGE-M3's cls, eos, pad and unk ids left out (the stage takes that maximum);
  colbert      colbert_linear(h) of every token but the first, each L2-normalized.
The graph answers the dense vectors, every token's weight and every token's colbert vector; the torch engine reads
the heads from hybrid_heads.npz.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoTokenizer, PreTrainedModel

from common.contract import HYBRID_HEADS_FILE, ServingSpec
from common.multi_vector import MultiVectorSpec
from common.padding import pad_sequences
from export.checkpoint import Checkpoint, CheckpointError
from export.multi_vector_export import preset_tokenizer
from export.onnx_export import Deviation, onnx_session
from export.reading import Reading

HEAD_FILES = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")  # no lexical weight (M3Embedder's list)


@dataclass(frozen=True)
class HybridHeads:
    sparse: tuple[np.ndarray, np.ndarray]  # weight [1, hidden], bias [1]
    colbert: tuple[np.ndarray, np.ndarray]  # weight [dim, hidden], bias [dim]


def read_hybrid(reading: Reading, seed: int = 0) -> None:
    """The checkpoint's two heads and serving.json's fields for them, into the reading."""
    checkpoint, hidden = reading.checkpoint, reading.checkpoint.config.hidden_size
    reading.heads = _heads(checkpoint, hidden, seed)
    reading.sides, reading.hybrid_fields = hybrid_spec(checkpoint, reading.heads, reading.max_tokens)
    where = "random-init preset" if checkpoint.root is None else ", ".join(HEAD_FILES.values())
    reading.add("lexical weights", "relu(sparse_linear(h)) per token, the largest per id", where)
    reading.add("colbert vectors", f"colbert_linear to {reading.hybrid_fields['colbert_size']}, normalized", where)


def _heads(checkpoint: Checkpoint, hidden: int, seed: int) -> HybridHeads:
    """The checkpoint's two heads; a random-init source gets random ones of BGE-M3's shapes (colbert dim = hidden)."""
    if checkpoint.root is None:
        generator = torch.Generator().manual_seed(seed)
        heads = {name: nn.Linear(hidden, 1 if name == "sparse" else hidden) for name in HEAD_FILES}
        with torch.no_grad():
            for linear in heads.values():
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) / hidden**0.5)
        states = {name: linear.state_dict() for name, linear in heads.items()}
    else:
        missing = [name for name in HEAD_FILES.values() if not (checkpoint.root / name).is_file()]
        if missing:
            raise CheckpointError(f"task hybrid needs BGE-M3's heads beside the weights: {', '.join(missing)} missing")
        states = {
            name: torch.load(checkpoint.root / file, map_location="cpu", weights_only=True)
            for name, file in HEAD_FILES.items()
        }
    arrays = {name: (state["weight"].float().numpy(), state["bias"].float().numpy()) for name, state in states.items()}
    for name, (weight, bias) in arrays.items():
        if weight.shape[1] != hidden or bias.shape != weight.shape[:1] or (name == "sparse" and len(weight) != 1):
            raise CheckpointError(f"{HEAD_FILES[name]}: weight {weight.shape}, bias {bias.shape} do not fit {hidden}")
    return HybridHeads(arrays["sparse"], arrays["colbert"])


def hybrid_spec(checkpoint: Checkpoint, heads: HybridHeads, max_tokens: int) -> tuple[MultiVectorSpec, dict]:
    """serving.json's multi_vector (both sides alike, no prompts, expansion or skiplist) and hybrid fields."""
    if checkpoint.folder is not None:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.folder)
    else:
        tokenizer = preset_tokenizer(checkpoint.tokenizer, checkpoint.config.model_type)
    special = tokenizer.special_tokens_map
    unused = sorted({tokenizer.convert_tokens_to_ids(special[name]) for name in UNUSED_TOKENS if name in special})
    sides = MultiVectorSpec("", "", max_tokens, max_tokens, None, 0, "fixed", False, (), False, False)
    return sides, {"colbert_size": int(heads.colbert[0].shape[0]), "unused_ids": unused}


def save_heads(heads: HybridHeads, out_dir: Path) -> None:
    np.savez(out_dir / HYBRID_HEADS_FILE, sparse_weight=heads.sparse[0], sparse_bias=heads.sparse[1],
             colbert_weight=heads.colbert[0], colbert_bias=heads.colbert[1])  # fmt: skip


class HybridStates(nn.Module):
    """What the hybrid graph serves: ids and mask in; fp32 dense [batch, hidden], token weights [batch, sequence]
    and colbert vectors [batch, sequence, dim] (the first token's too: the stage drops it) out."""

    def __init__(self, model: PreTrainedModel, heads: HybridHeads) -> None:
        super().__init__()
        self.encoder = model
        self.sparse = self._linear(*heads.sparse)
        self.colbert = self._linear(*heads.colbert)

    @staticmethod
    def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
        linear = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weight))
            linear.bias.copy_(torch.from_numpy(bias))
        return linear

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
        dense = F.normalize(hidden[:, 0], p=2, dim=-1)
        weights = torch.relu(self.sparse(hidden)).squeeze(-1)
        return dense, weights, F.normalize(self.colbert(hidden), p=2, dim=-1)

    def dense(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The dense vectors alone (the int8/uint8 calibration's)."""
        return self(input_ids, attention_mask)[0]


def validate_hybrid(module: HybridStates, onnx_path: Path, sequences: list[np.ndarray],
                    spec: ServingSpec) -> Deviation:  # fmt: skip
    """The graph on one padded batch against the PyTorch module on each sequence alone: all three outputs of every
    real token, at the scale of the largest."""
    ids, mask = pad_sequences(sequences, spec.pad_token_id)
    served = onnx_session(onnx_path).run(None, {"input_ids": ids, "attention_mask": mask})
    difference, largest = 0.0, 0.0
    with torch.no_grad():
        for index, sequence in enumerate(sequences):
            alone = module(torch.from_numpy(sequence[None]), torch.ones((1, len(sequence)), dtype=torch.int32))
            cuts = (served[0][index], served[1][index, : len(sequence)], served[2][index, : len(sequence)])
            for got, want in zip(cuts, (part[0].numpy() for part in alone), strict=True):
                difference = max(difference, float(np.abs(got - want).max()))
                largest = max(largest, float(np.abs(want).max()))
    return Deviation(difference, largest)
