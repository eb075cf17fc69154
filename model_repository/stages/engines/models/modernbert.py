"""ModernBERT (transformers' ModernBertModel, ModernBertForSequenceClassification): token embeddings and a
LayerNorm (no positions: rotary ones in every attention), pre-norm layers without biases (the first has no
attention norm), GeGLU feed-forwards, a final norm, and attention that alternates between global layers and local
ones that see only keys within local_attention // 2 positions of the query (each kind with its own rotary theta),
over up to max_position_embeddings (8,192) tokens. For classification: the first token or the tokens' mean, dense,
activation, LayerNorm, classifier. Older config.json files name the layer pattern and the thetas
global_attn_every_n_layers, global_rope_theta and local_rope_theta; both spellings are read as transformers reads them.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from common.contract import ServingSpec

from ..torch_ops import PackedBatch, TorchOps
from ..torch_weights import Weights
from .encoder import HEAD_ACTIVATIONS, ClassificationHead, Encoder, activation

BASE = {"num_hidden_layers": 22, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 1152}
# answerdotai/ModernBERT-base's config.json fields besides its shape (the older spelling of the pattern and thetas).
FIELDS = {
    "model_type": "modernbert", "vocab_size": 50368, "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
    "local_attention": 128, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "norm_eps": 1e-5,
    "norm_bias": False, "attention_bias": False, "mlp_bias": False, "hidden_activation": "gelu",
    "classifier_pooling": "mean", "classifier_activation": "gelu", "classifier_bias": False, "pad_token_id": 50283,
}  # fmt: skip
# layer type -> (the older config.json field of its rotary theta, ModernBertConfig's default theta)
THETAS = {"full_attention": ("global_rope_theta", 160000.0), "sliding_attention": ("local_rope_theta", 10000.0)}


def layer_types(config: dict) -> list[str]:
    """Each layer's attention, as ModernBertConfig derives it: layer_types, else every global_attn_every_n_layers-th
    layer global (the first included) and the others local."""
    count = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None:
        every = int(config.get("global_attn_every_n_layers", 3))
        kinds = ["sliding_attention" if index % every else "full_attention" for index in range(count)]
    unknown = sorted(set(kinds) - set(THETAS))
    if unknown or len(kinds) != count:
        raise ValueError(f"layer_types {kinds!r}: {count} of {sorted(THETAS)} expected")
    return list(kinds)


def rope_theta(config: dict, kind: str) -> float:
    """The rotary theta of one layer type (ModernBertConfig.convert_rope_params_to_dict); only default rotary
    positions are served (scaled ones would change every angle)."""
    params = {**((config.get("rope_parameters") or {}).get(kind) or {}), **(config.get("rope_scaling") or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} ({kind}) is not supported: only default rotary positions")
    field, default = THETAS[kind]
    return float(params.get("rope_theta", config.get(field, default)))


def rotary_tables(theta: float, head_dim: int, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim // 2] in fp32, computed as ModernBertRotaryEmbedding computes them (its
    tables repeat these across the two halves of a head)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    angles = torch.arange(positions).float()[:, None] * inv_freq
    return angles.cos().to(device).contiguous(), angles.sin().to(device).contiguous()


class PreNormLayer:
    """x += Wo(attention(rotary(Wqkv(LN(x))))); x += Wo(act(input) * gate of Wi(LN(x))), the residuals in the GEMMs."""

    __slots__ = ("attn_norm", "bi", "bo", "bo2", "bqkv", "kind", "mlp_norm", "wi", "wo", "wo2", "wqkv")

    def __init__(self, w: Weights, index: int, kind: str, eps: float, attention_bias: bool, mlp_bias: bool) -> None:
        p = f"layers.{index}."
        self.kind = kind
        self.attn_norm = w.norm(p + "attn_norm", eps) if index else None  # layer 0 reads the embedding norm's output
        self.wqkv, self.bqkv = w.gemm(p + "attn.Wqkv.weight"), w(p + "attn.Wqkv.bias") if attention_bias else None
        self.wo, self.bo = w.gemm(p + "attn.Wo.weight"), w(p + "attn.Wo.bias") if attention_bias else None
        self.mlp_norm = w.norm(p + "mlp_norm", eps)
        self.wi, self.bi = w.gemm(p + "mlp.Wi.weight"), w(p + "mlp.Wi.bias") if mlp_bias else None
        self.wo2, self.bo2 = w.gemm(p + "mlp.Wo.weight"), w(p + "mlp.Wo.bias") if mlp_bias else None

    def __call__(self, x: torch.Tensor, batch: PackedBatch, model: ModernBertEncoder) -> torch.Tensor:
        ops = model.ops
        qkv = ops.linear(x if self.attn_norm is None else ops.norm(x, self.attn_norm), self.wqkv, self.bqkv)
        ops.rotary(qkv, batch, *model.rotary[self.kind])
        ctx = ops.attend(qkv, batch, model.heads, model.scale, None, model.windows[self.kind])
        residual(ops, ctx, self.wo, self.bo, x)
        h = ops.glu_ffn(ops.norm(x, self.mlp_norm), self.wi, self.bi, model.act)
        return residual(ops, h, self.wo2, self.bo2, x)


def residual(ops: TorchOps, inp: torch.Tensor, weight: torch.Tensor, bias, x: torch.Tensor) -> torch.Tensor:
    """x += inp @ weight^T [+ bias], in place."""
    ops.proj_add(inp, weight, x)
    return x if bias is None else x.add_(bias)


class ModernBertEncoder(Encoder):
    prefix = "model."
    presets: ClassVar[dict[str, dict]] = {
        "modernbert-base": {**FIELDS, **BASE},
        # local_attention 16: test sequences of ~100 tokens reach past the window
        "modernbert-tiny": {**FIELDS, "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                            "intermediate_size": 96, "local_attention": 16},
    }  # fmt: skip

    @classmethod
    def positions(cls, config: dict) -> int:
        return int(config.get("max_position_embeddings", 8192))

    def __init__(self, config: dict, weights: Weights, ops: TorchOps, spec: ServingSpec) -> None:
        super().__init__(config, weights, ops, spec)
        self.set_sizes(int(config["hidden_size"]), int(config["num_attention_heads"]))
        self.act = activation(config.get("hidden_activation", "gelu"))
        eps = float(config.get("norm_eps", 1e-5))
        kinds = layer_types(config)
        # transformers masks keys further than local_attention // 2 from the query (|q - k| <= window kept)
        self.windows = {"full_attention": 0, "sliding_attention": int(config.get("local_attention", 128)) // 2}
        self.plain_attention = "sliding_attention" not in kinds
        self.rotary = {
            kind: rotary_tables(rope_theta(config, kind), self.head_dim, self.max_positions, weights.device)
            for kind in THETAS
        }
        self.word = weights("embeddings.tok_embeddings.weight")
        self.no_type = torch.zeros((self.hidden,), device=weights.device, dtype=weights.dtype)  # no token types
        self.emb_norm = weights.norm("embeddings.norm", eps)
        attention_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
        self.layers = [PreNormLayer(weights, index, kind, eps, attention_bias, mlp_bias)
                       for index, kind in enumerate(kinds)]  # fmt: skip
        self.final_norm = weights.norm("final_norm", eps)
        self.load_head(config, weights, eps)

    def load_head(self, config: dict, w: Weights, eps: float) -> None:
        if self.spec.task == "embedding":
            return
        pooling = config.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {pooling!r} is not supported: cls or mean")
        act = config.get("classifier_activation", "gelu")
        if act not in HEAD_ACTIVATIONS:
            raise ValueError(f"classifier_activation {act!r} is not supported; supported: {sorted(HEAD_ACTIVATIONS)}")
        dense = (w.fp32("head.dense.weight"), w.fp32("head.dense.bias") if config.get("classifier_bias") else None)
        classifier = (w.fp32("classifier.weight"), w.fp32("classifier.bias"))
        self.set_head(ClassificationHead(classifier, dense, act, w.norm("head.norm", eps), pooling))

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        x = self.ops.embed(batch, self.word, None, self.no_type, self.emb_norm, False)
        for layer in self.layers:
            x = layer(x, batch, self)
        return self.ops.add_ln(x, None, None, self.final_norm)
