"""DistilBERT: BERT's post-norm layers under names of its own, word + position embeddings (no token types), and
a head of its own (first token, pre_classifier, ReLU, classifier)."""

from __future__ import annotations

from typing import ClassVar

from common.contract import ServingSpec

from ..torch_ops import TorchOps
from ..torch_sparse import SparseHead
from ..torch_weights import Weights
from .bert import BertEncoder
from .encoder import ClassificationHead, PostNormLayer

# DistilBertConfig's own field names (dim, n_layers, ...): config.json holds these.
BASE = {"n_layers": 6, "dim": 768, "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522}
EPS = 1e-12  # DistilBERT's LayerNorms are built with this eps, not from the config


class DistilBertEncoder(BertEncoder):
    prefix = "distilbert."
    presets: ClassVar[dict[str, dict]] = {
        "distilbert-base": {"model_type": "distilbert", **BASE},
        "distilbert-tiny": {"model_type": "distilbert", **BASE, "n_layers": 2, "dim": 128, "n_heads": 2,
                            "hidden_dim": 512},
    }  # fmt: skip

    @classmethod
    def reads_token_types(cls, config: dict) -> bool:
        return False

    def __init__(self, config: dict, weights: Weights, ops: TorchOps, spec: ServingSpec) -> None:
        super().__init__(
            {
                **config,
                "hidden_size": config.get("dim", config.get("hidden_size")),
                "num_attention_heads": config.get("n_heads", config.get("num_attention_heads")),
                "num_hidden_layers": config.get("n_layers", config.get("num_hidden_layers")),
                "hidden_act": config.get("activation", "gelu"),
                "layer_norm_eps": EPS,
            },
            weights, ops, spec,
        )  # fmt: skip

    def load_layer(self, w: Weights, index: int) -> PostNormLayer:
        p = f"transformer.layer.{index}."
        a = p + "attention."
        return PostNormLayer(
            w, (a + "q_lin", a + "k_lin", a + "v_lin"), a + "out_lin", p + "sa_layer_norm",
            p + "ffn.lin1", p + "ffn.lin2", p + "output_layer_norm", self.eps,
        )  # fmt: skip

    def load_head(self, w: Weights) -> None:
        if self.spec.task == "embedding":
            return
        if self.spec.task == "sparse":  # DistilBertForMaskedLM's head (OpenSearch's neural-sparse doc models)
            self.set_head(SparseHead.load(
                w, "vocab_transform", "vocab_layer_norm", "vocab_projector.weight", "vocab_projector.bias",
                "embeddings.word_embeddings.weight", self.act, EPS, self.spec.activation == "log1p_relu",
            ))  # fmt: skip
            return
        dense = (w.fp32("pre_classifier.weight"), w.fp32("pre_classifier.bias"))
        self.set_head(ClassificationHead((w.fp32("classifier.weight"), w.fp32("classifier.bias")), dense, "relu"))
