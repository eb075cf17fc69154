"""BERT (transformers' BertModel, BertForSequenceClassification): word + position + token type embeddings,
post-norm layers, and for classification the pooler (first token, dense, tanh) before the classifier.

Its layer and embedding code serve the families built on it (roberta.py, distilbert.py, mpnet.py), which
override what differs: weight names, where positions start, the head."""

from __future__ import annotations

from typing import ClassVar

import torch

from common.contract import ServingSpec

from ..torch_layout import TYPE_SHIFT
from ..torch_ops import PackedBatch, TorchOps
from ..torch_sparse import SparseHead
from ..torch_weights import Weights
from .encoder import ClassificationHead, Encoder, PostNormLayer, activation

SHAPES = {
    "bert-base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
    # all-MiniLM-L6-v2's shape, and the common cross-encoder ms-marco-MiniLM-L-6-v2's
    "minilm": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
    "bert-tiny": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
}


class BertEncoder(Encoder):
    prefix = "bert."
    presets: ClassVar[dict[str, dict]] = {
        name: {"model_type": "bert", "vocab_size": 30522, **shape} for name, shape in SHAPES.items()
    }

    @classmethod
    def reads_token_types(cls, config: dict) -> bool:
        return int(config.get("type_vocab_size", 2)) > 1

    def __init__(self, config: dict, weights: Weights, ops: TorchOps, spec: ServingSpec) -> None:
        super().__init__(config, weights, ops, spec)
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {config['position_embedding_type']!r}: only absolute is served")
        self.set_sizes(int(config["hidden_size"]), int(config["num_attention_heads"]))
        self.act = activation(config.get("hidden_act", "gelu"))
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.position_start = self.first_position(config)
        self.load_embeddings(weights)
        self.layers = [self.load_layer(weights, index) for index in range(int(config["num_hidden_layers"]))]
        self.load_head(weights)

    def load_embeddings(self, w: Weights) -> None:
        self.word = w("embeddings.word_embeddings.weight")
        self.position_table = w("embeddings.position_embeddings.weight")
        types = w.get("embeddings.token_type_embeddings.weight")
        # [types, hidden]: a pair's tokens pick their row (the type rides in the id's top bits); one text reads row 0.
        self.types = types if types is not None else torch.zeros((1, self.hidden), device=w.device, dtype=w.dtype)
        self.type0 = self.types[0].contiguous()
        if self.pair_types and self.word.shape[0] >= 1 << TYPE_SHIFT:
            raise ValueError(f"a vocabulary of {self.word.shape[0]} ids leaves no bits for a pair's token types")
        self.emb_norm = w.norm("embeddings.LayerNorm", self.eps)

    def load_layer(self, w: Weights, index: int) -> PostNormLayer:
        p = f"encoder.layer.{index}."
        a = p + "attention.self."
        return PostNormLayer(
            w, (a + "query", a + "key", a + "value"), p + "attention.output.dense", p + "attention.output.LayerNorm",
            p + "intermediate.dense", p + "output.dense", p + "output.LayerNorm", self.eps,
        )  # fmt: skip

    def load_head(self, w: Weights) -> None:
        if self.spec.task == "embedding":
            return
        if self.spec.task == "sparse":  # BertForMaskedLM's head
            p = "cls.predictions."
            self.set_head(SparseHead.load(
                w, p + "transform.dense", p + "transform.LayerNorm", p + "decoder.weight", p + "bias",
                "embeddings.word_embeddings.weight", self.act, self.eps, self.spec.activation == "log1p_relu",
            ))  # fmt: skip
            return
        pooler = (w.fp32("pooler.dense.weight"), w.fp32("pooler.dense.bias")) if w.has("pooler.dense.weight") else None
        self.set_head(ClassificationHead((w.fp32("classifier.weight"), w.fp32("classifier.bias")), pooler, "tanh"))

    def attention_bias(self, batch: PackedBatch) -> torch.Tensor | None:
        """An additive bias by relative position for every layer's attention (torch_attention.py); none here."""
        return None

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        types = self.types if self.pair_types else self.type0
        x = self.ops.embed(batch, self.word, self.position_table, types, self.emb_norm, self.pair_types,
                           self.position_start)  # fmt: skip
        bias = self.attention_bias(batch)
        for layer in self.layers:
            x = layer(x, batch, self, self.act, bias)
        return x
