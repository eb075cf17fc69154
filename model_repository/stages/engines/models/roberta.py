"""RoBERTa, XLM-RoBERTa and CamemBERT (one architecture, three model_types): BERT's layers, with positions that
start after the padding id (a sequence's first token reads row padding_idx + 1), no token types (the tokenizers
send none, and the table has one row), and a classification head of its own (first token, dense, tanh,
out_proj), no pooler."""

from __future__ import annotations

from typing import ClassVar

from ..torch_weights import Weights
from .bert import BertEncoder
from .encoder import ClassificationHead

BASE = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
POSITIONS = {"max_position_embeddings": 514, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
POSITIONS["type_vocab_size"] = 1


class RobertaEncoder(BertEncoder):
    prefix = "roberta."
    presets: ClassVar[dict[str, dict]] = {
        "roberta-base": {"model_type": "roberta", "vocab_size": 50265, **BASE, **POSITIONS},
        "xlm-roberta-base": {"model_type": "xlm-roberta", "vocab_size": 250002, **BASE, **POSITIONS},
        # BAAI/bge-m3's encoder: XLM-RoBERTa-large's layers, positions to 8,192 tokens.
        "bge-m3": {"model_type": "xlm-roberta", "vocab_size": 250002, **POSITIONS, "num_hidden_layers": 24,
                   "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096,
                   "max_position_embeddings": 8194},
        "roberta-tiny": {"model_type": "roberta", "vocab_size": 50265, **POSITIONS, "num_hidden_layers": 2,
                         "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    }  # fmt: skip

    @classmethod
    def padding_idx(cls, config: dict) -> int:
        return int(config.get("pad_token_id", 1))

    @classmethod
    def positions(cls, config: dict) -> int:
        return int(config.get("max_position_embeddings", 514)) - cls.padding_idx(config) - 1

    @classmethod
    def reads_token_types(cls, config: dict) -> bool:
        return False

    @classmethod
    def first_position(cls, config: dict) -> int:
        return cls.padding_idx(config) + 1

    def load_head(self, w: Weights) -> None:
        if self.spec.task == "embedding":
            return
        dense = (w.fp32("classifier.dense.weight"), w.fp32("classifier.dense.bias"))
        out = (w.fp32("classifier.out_proj.weight"), w.fp32("classifier.out_proj.bias"))
        self.set_head(ClassificationHead(out, dense, "tanh"))
