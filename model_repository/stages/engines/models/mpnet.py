"""MPNet (all-mpnet-base-v2's architecture): BERT's post-norm layers under names of its own, word + position
embeddings whose positions start after the padding id (always 1 in MPNetEmbeddings), no token types, RoBERTa's
head (first token, dense, tanh, out_proj), and in every layer's attention one bias shared by all layers: a
learned value per head for the bucketed distance between query and key (T5's relative position buckets).

The bias depends only on the relative distance, so it is looked up once at load into a table of every distance
a sequence can have ([heads, 2 * positions - 1]) that the attention reads (torch_attention.py)."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from common.contract import ServingSpec

from ..torch_ops import PackedBatch, TorchOps
from ..torch_weights import Weights
from .encoder import PostNormLayer
from .roberta import RobertaEncoder

BASE = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
# MPNetEncoder.compute_position_bias buckets with these whatever the config says (its table has 32 rows).
BUCKETS, MAX_DISTANCE = 32, 128
PADDING_IDX = 1  # MPNetEmbeddings' own, not read from the config


def relative_buckets(relative: torch.Tensor) -> torch.Tensor:
    """The bucket of each (key - query) distance, as MPNetEncoder.relative_position_bucket computes it (fp32
    logarithms included, so that the boundaries fall where transformers puts them)."""
    half = BUCKETS // 2
    n = -relative
    bucket = (n < 0).to(torch.long) * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).to(torch.long)
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return bucket + torch.where(n < exact, n, large)


class MPNetEncoder(RobertaEncoder):
    prefix = "mpnet."
    presets: ClassVar[dict[str, dict]] = {
        "mpnet-base": {"model_type": "mpnet", "vocab_size": 30527, "max_position_embeddings": 514, **BASE},
        "mpnet-tiny": {"model_type": "mpnet", "vocab_size": 30527, "max_position_embeddings": 514,
                       "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    }  # fmt: skip

    plain_attention = False

    @classmethod
    def padding_idx(cls, config: dict) -> int:
        return PADDING_IDX

    def __init__(self, config: dict, weights: Weights, ops: TorchOps, spec: ServingSpec) -> None:
        super().__init__(config, weights, ops, spec)
        table = weights.fp32("encoder.relative_attention_bias.weight")  # [buckets, heads]
        if table.shape[0] < BUCKETS:
            raise ValueError(f"relative_attention_bias has {table.shape[0]} buckets; MPNet reads {BUCKETS}")
        longest = self.max_positions
        distances = torch.arange(-(longest - 1), longest, device=table.device)
        self.bias_table = table[relative_buckets(distances)].t().contiguous()  # [heads, 2 * longest - 1]

    def load_layer(self, w: Weights, index: int) -> PostNormLayer:
        p = f"encoder.layer.{index}."
        a = p + "attention."
        return PostNormLayer(
            w, (a + "attn.q", a + "attn.k", a + "attn.v"), a + "attn.o", a + "LayerNorm",
            p + "intermediate.dense", p + "output.dense", p + "output.LayerNorm", self.eps,
        )  # fmt: skip

    def attention_bias(self, batch: PackedBatch) -> torch.Tensor:
        return self.bias_table
