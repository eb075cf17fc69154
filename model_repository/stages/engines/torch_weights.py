"""A BERT checkpoint as the torch engine holds it: config read, weights cast and laid out for its GEMMs.

`BertCheckpoint` is the engine's base for this: `_read_config` sets the sizes from config.json and
`_load_weights` puts every tensor on the device (GEMM weights in the GEMM dtype, Q, K and V fused into one
matrix, LayerNorm parameters in fp32 and in the compute dtype, the classification head in fp32).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from .torch_layout import TYPE_SHIFT, next_pow2

log = logging.getLogger(__name__)


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    path = model_dir / "model.safetensors"
    if path.is_file():
        from safetensors.torch import load_file

        raw = load_file(str(path), device="cpu")
    elif (model_dir / "pytorch_model.bin").is_file():
        raw = torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")
    state = {}
    for name, tensor in raw.items():
        if name.startswith("bert."):
            name = name[len("bert.") :]
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        state[name] = tensor
    return state


class Layer:
    """One encoder layer: fused QKV, attention output, FFN and two LayerNorms (fp32, and in the compute dtype)."""

    __slots__ = ("b1", "b2", "bo", "bqkv", "ln1", "ln1_t", "ln2", "ln2_t", "w1", "w2", "wo", "wqkv")


class BertCheckpoint:
    def _read_config(self, config: dict) -> None:
        if config.get("model_type", "bert") != "bert":
            log.warning("model_type %r: treated as BERT", config.get("model_type"))
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.num_layers = int(config["num_hidden_layers"])
        self.intermediate = int(config["intermediate_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.max_positions = int(config.get("max_position_embeddings", 512))
        act = config.get("hidden_act", "gelu")
        if act in ("gelu", "gelu_python"):
            self.tanh_gelu = False
        elif act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            self.tanh_gelu = True
        else:
            raise ValueError(f"hidden_act {act!r} is not supported")
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.block_h = next_pow2(self.hidden)

    def _load_weights(self, sd: dict[str, torch.Tensor]) -> None:
        dev, dt = self.torch_device, self.dtype
        gemm = torch.bfloat16 if self.gemm_bf16 else dt

        def w(name: str, dtype=dt) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"checkpoint has no {name}")
            return sd[name].to(device=dev, dtype=dtype).contiguous()

        def ln(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
            return w(prefix + ".weight", torch.float32), w(prefix + ".bias", torch.float32)

        self.word = w("embeddings.word_embeddings.weight")
        self.posw = w("embeddings.position_embeddings.weight")
        type_emb = sd.get("embeddings.token_type_embeddings.weight")
        # [types, hidden]: row 0 for every token of a single text; a pair's tokens pick theirs (TYPE_SHIFT).
        self.types_table = (
            type_emb.to(device=dev, dtype=dt).contiguous()
            if type_emb is not None
            else torch.zeros((1, self.hidden), device=dev, dtype=dt)
        )
        self.type0 = self.types_table[0].contiguous()
        if self.spec.pairs and self.word.shape[0] >= 1 << TYPE_SHIFT:
            raise ValueError(f"a vocabulary of {self.word.shape[0]} ids leaves no bits for a pair's token types")
        self.emb_ln = ln("embeddings.LayerNorm")
        self.emb_ln_t = tuple(t.to(dt) for t in self.emb_ln)
        self.layers = []
        for i in range(self.num_layers):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            layer = Layer()
            qkv = [w(a + f"{name}.weight", gemm) for name in ("query", "key", "value")]
            layer.wqkv = torch.cat(qkv).contiguous()
            layer.bqkv = torch.cat([w(a + "query.bias"), w(a + "key.bias"), w(a + "value.bias")]).contiguous()
            layer.wo = w(p + "attention.output.dense.weight", gemm)
            layer.bo = w(p + "attention.output.dense.bias")
            layer.ln1 = ln(p + "attention.output.LayerNorm")
            layer.w1, layer.b1 = w(p + "intermediate.dense.weight", gemm), w(p + "intermediate.dense.bias")
            layer.w2, layer.b2 = w(p + "output.dense.weight", gemm), w(p + "output.dense.bias")
            layer.ln2 = ln(p + "output.LayerNorm")
            layer.ln1_t = tuple(t.to(dt) for t in layer.ln1)
            layer.ln2_t = tuple(t.to(dt) for t in layer.ln2)
            self.layers.append(layer)
        if self.spec.task in ("classification", "rerank"):
            f32 = torch.float32
            if "pooler.dense.weight" in sd:
                self.pooler = (w("pooler.dense.weight", f32), w("pooler.dense.bias", f32))
            else:
                self.pooler = None
            self.classifier = (w("classifier.weight", f32), w("classifier.bias", f32))
            if self.spec.task == "rerank":  # a reranker's score is its first logit
                self.classifier = tuple(part[:1].contiguous() for part in self.classifier)
            self.output_size = int(self.classifier[0].shape[0])
        else:
            self.output_size = self.hidden
        if self.spec.output_size and self.spec.output_size != self.output_size:
            raise ValueError(f"serving.json: output_size {self.spec.output_size}; the model gives {self.output_size}")
