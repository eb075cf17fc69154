"""What every architecture module implements (`Encoder`), and the parts they share: the task's output (pooled
embedding or classification head) and the post-norm layer of BERT and its descendants."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from common.contract import ServingSpec

from ..torch_ops import Norm, PackedBatch, TorchOps
from ..torch_sparse import SparseHead
from ..torch_weights import Weights

# config.json hidden_act -> what TorchOps.ffn_up applies.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
HEAD_ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


def activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


@dataclass
class ClassificationHead:
    """Logits from the encoder's last hidden states, in fp32: a sequence's first token (or its tokens' mean)
    -> [dense -> activation -> [LayerNorm]] -> classifier."""

    classifier: tuple[torch.Tensor, torch.Tensor]
    dense: tuple[torch.Tensor, torch.Tensor | None] | None = None
    activation: str = "tanh"
    norm: Norm | None = None
    pooling: str = "cls"  # cls | mean

    @property
    def output_size(self) -> int:
        return int(self.classifier[0].shape[0])

    def __call__(self, x: torch.Tensor, batch: PackedBatch, ops: TorchOps) -> torch.Tensor:
        if self.pooling == "mean":
            h = ops.pool(x, batch, "mean", False)
        else:
            h = x.index_select(0, batch.cu[:-1].long().clamp(max=x.shape[0] - 1)).float()
        if self.dense is not None:
            h = HEAD_ACTIVATIONS[self.activation](F.linear(h, *self.dense))
        if self.norm is not None:
            h = F.layer_norm(h, (h.shape[1],), self.norm.weight, self.norm.bias, self.norm.eps)
        return F.linear(h, *self.classifier)


class Encoder:
    """One architecture on the packed token stream: built from its config.json and weights, it turns a
    PackedBatch into one fp32 row per sequence (the pooled embedding, or the classifier's logits)."""

    # Random-init presets of the family's real shapes: name -> config.json fields (model_type included).
    presets: ClassVar[dict[str, dict]] = {}
    # Whether every attention is plain softmax(Q K^T) V per sequence, which FlashAttention's varlen kernels can
    # run; one with a bias or a window needs the Triton kernel or the grid SDPA (torch_attention.py).
    plain_attention = True

    @classmethod
    def positions(cls, config: dict) -> int:
        """The most tokens a sequence may have: what the checkpoint's position embeddings cover."""
        return int(config.get("max_position_embeddings", 512))

    @classmethod
    def first_position(cls, config: dict) -> int:
        """The row of the position embeddings a sequence's first token reads (RoBERTa's start after the padding
        id; transformers computes them from the ids with a cumulative sum, which the export spells out)."""
        return 0

    @classmethod
    def reads_token_types(cls, config: dict) -> bool:
        """Whether the model adds a token type embedding to a pair's second text (BERT's segments)."""
        return False

    def __init__(self, config: dict, weights: Weights, ops: TorchOps, spec: ServingSpec) -> None:
        self.config, self.ops, self.spec = config, ops, spec
        self.max_positions = self.positions(config)
        self.pair_types = spec.pairs and self.reads_token_types(config)
        self.head: ClassificationHead | SparseHead | None = None  # set by the family for the tasks with a head

    def set_sizes(self, hidden: int, heads: int) -> None:
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)

    @property
    def output_size(self) -> int:
        return self.hidden if self.head is None else self.head.output_size

    def set_head(self, head: ClassificationHead | SparseHead) -> None:
        """The head for classification and rerank (a reranker's score is its first logit) and sparse (the MLM head
        and SpladePooling: torch_sparse.py); none for embeddings."""
        if self.spec.task == "embedding":
            return
        if self.spec.task == "rerank":
            head.classifier = tuple(part[:1].contiguous() for part in head.classifier)
        self.head = head

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """The last hidden state of every token [T, hidden], in the compute dtype."""
        raise NotImplementedError

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.hidden_states(batch)
        if self.head is None:
            return self.ops.pool(x, batch, self.spec.pooling, self.spec.normalize)
        return self.head(x, batch, self.ops)


class PostNormLayer:
    """BERT's layer (and RoBERTa's, DistilBERT's, MPNet's): x = LN(x + attention(x)); x = LN(x + FFN(x)), with Q,
    K and V fused into one GEMM."""

    __slots__ = ("b1", "b2", "bo", "bqkv", "ln1", "ln2", "w1", "w2", "wo", "wqkv")

    def __init__(self, w: Weights, qkv: tuple[str, str, str], out: str, ln1: str, up: str, down: str, ln2: str, eps):
        self.wqkv = torch.cat([w.gemm(f"{name}.weight") for name in qkv]).contiguous()
        self.bqkv = torch.cat([w(f"{name}.bias") for name in qkv]).contiguous()
        self.wo, self.bo = w.gemm(out + ".weight"), w(out + ".bias")
        self.ln1 = w.norm(ln1, eps)
        self.w1, self.b1 = w.gemm(up + ".weight"), w(up + ".bias")
        self.w2, self.b2 = w.gemm(down + ".weight"), w(down + ".bias")
        self.ln2 = w.norm(ln2, eps)

    def __call__(self, x, batch: PackedBatch, model: Encoder, act: str, bias=None) -> torch.Tensor:
        ops = model.ops
        qkv = ops.linear(x, self.wqkv, self.bqkv)
        ctx = ops.attend(qkv, batch, model.heads, model.scale, bias)
        x = ops.proj_add_ln(ctx, self.wo, self.bo, x, self.ln1)
        h = ops.ffn_up(x, self.w1, self.b1, act)
        return ops.proj_add_ln(h, self.w2, self.b2, x, self.ln2)
