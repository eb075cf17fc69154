"""Tiny checkpoints of every encoder family, as Hugging Face and sentence-transformers save them: what the export,
engine and server tests serve and hold to transformers, SentenceTransformer and CrossEncoder.

    make_checkpoint(tmp_path / "xlmr", "xlm-roberta", "embedding", pooling="cls")

A checkpoint holds random weights of the family's own transformers config class, its task head, and a tokenizer
of the family's real layout trained on the bundled texts (export/tokenizer_training.py; BERT reads MiniLM's
WordPiece vocabulary), so that real sentences tokenize as they would for a real checkpoint of the family.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from export.checkpoint import family_tokenizer
from export.onnx_export import VALIDATION_SENTENCES
from export.tokenizer_training import config_token_ids, save_tokenizer

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "modernbert")
LABELS = ("negative", "neutral", "positive")  # a classification checkpoint's id2label
VOCABULARY = 4000  # a trained tokenizer's: small, and enough for whole words of the validation sentences
MAX_TOKENS = 512  # the tokenizer's model_max_length, and sentence-transformers' max_seq_length
# Weights 5x the families' initializer_range: random encoders of 0.02 pool nearly the same vector for any text, so
# a score's spread would be noise amplified by the head (and embeddings would hardly tell texts apart).
INIT = {"initializer_range": 0.1}
LAYERS = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, **INIT}
# Positions as the real checkpoints have them: 514 rows, the first two taken by RoBERTa's padding offset.
ROBERTA = {**LAYERS, "max_position_embeddings": 514, "type_vocab_size": 1}
TINY = {
    "bert": LAYERS,
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
    "camembert": ROBERTA,
    "distilbert": {"n_layers": 2, "dim": 64, "n_heads": 4, "hidden_dim": 128, **INIT},  # DistilBertConfig's names
    "mpnet": {**LAYERS, "max_position_embeddings": 514},
    # Three layers: one global, two sliding-window ones (global_attn_every_n_layers = 3) of 16 tokens, which the
    # validation sentences outgrow.
    "modernbert": {
        "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
        "max_position_embeddings": 8192, "local_attention": 16, **INIT,
    },
}  # fmt: skip


def make_checkpoint(
    path: Path,
    model_type: str,
    task: str,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    seed: int = 0,
    score_spread: float = 3.0,
    **config_overrides,
) -> Path:
    """A `model_type` checkpoint for `task` (embedding | classification | rerank) in path, tiny unless
    config_overrides say otherwise: an embedder with its sentence-transformers modules (`pooling`, and Normalize
    if `normalize`), a classifier of three named labels, or a cross-encoder of one logit whose scores on the
    validation sentences' pairs spread over about +-score_spread (real cross-encoders' reach +-10). The folder."""
    tokenizer = family_tokenizer(model_type, VOCABULARY)
    fields = {"vocab_size": tokenizer.get_vocab_size(), **config_token_ids(tokenizer, model_type), **TINY[model_type]}
    if task == "classification":
        fields |= {"id2label": dict(enumerate(LABELS)), "label2id": {label: i for i, label in enumerate(LABELS)}}
    elif task == "rerank":
        fields["num_labels"] = 1
    config = transformers.AutoConfig.for_model(model_type, **{**fields, **config_overrides})
    torch.manual_seed(seed)
    auto = transformers.AutoModel if task == "embedding" else transformers.AutoModelForSequenceClassification
    model = auto.from_config(config).eval()
    save_tokenizer(tokenizer, model_type, path, MAX_TOKENS)
    if task == "rerank":
        spread_scores(model, path, score_spread)
    model.save_pretrained(str(path), safe_serialization=True)
    if task == "embedding":
        write_sentence_transformers(path, config.hidden_size, pooling, normalize)
    return path


def spread_scores(model: transformers.PreTrainedModel, path: Path, spread: float) -> None:
    """Scale and shift the head's last linear map so that the pairs' logits centre on 0 and reach +-spread: a
    fresh head gives every pair nearly the same logit (random encoders pool nearly the same vector)."""
    sentences = VALIDATION_SENTENCES.read_text().splitlines()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(sentences, sentences[1:] + sentences[:1], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[:, 0]
        head = [m for name, m in model.named_modules() if name.startswith("classifier")]
        last = [m for m in head if isinstance(m, torch.nn.Linear)][-1]
        scale = spread / (logits - logits.mean()).abs().max()
        last.weight.mul_(scale)
        last.bias.sub_(logits.mean()).mul_(scale)


def write_sentence_transformers(path: Path, hidden_size: int, pooling: str, normalize: bool) -> None:
    """modules.json and its modules' folders: Transformer, Pooling in `pooling` mode, and Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_TOKENS}) + "\n")
    (path / "1_Pooling").mkdir(exist_ok=True)
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
    chosen = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens", "mean_sqrt_len": "mean_sqrt_len_tokens"}
    pooling_config = {"word_embedding_dimension": hidden_size}
    pooling_config |= {f"pooling_mode_{mode}": mode == chosen[pooling] for mode in modes}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")


def make_sparse_checkpoint(
    path: Path, model_type: str = "bert", *, activation: str = "relu", nonzero: float = 0.01, seed: int = 0
) -> Path:
    """A SPLADE checkpoint in path: random masked-LM weights of the tiny `model_type` (bert or distilbert, the
    OpenSearch doc models' family) with its tokenizer, saved by sentence-transformers as a SparseEncoder
    (MLMTransformer + SpladePooling max, `activation`). A fresh decoder's logits are positive for about half the
    vocabulary, so its bias is lowered until about `nonzero` of the vocabulary weighs something per validation
    sentence, as sparse as a trained SPLADE's vectors. The folder."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    tokenizer = family_tokenizer(model_type, VOCABULARY)
    fields = {"vocab_size": tokenizer.get_vocab_size(), **config_token_ids(tokenizer, model_type), **TINY[model_type]}
    torch.manual_seed(seed)
    model = transformers.AutoModelForMaskedLM.from_config(transformers.AutoConfig.for_model(model_type, **fields))
    save_tokenizer(tokenizer, model_type, path, MAX_TOKENS)
    batch = transformers.AutoTokenizer.from_pretrained(path)(
        VALIDATION_SENTENCES.read_text().splitlines(), padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = model.eval()(**batch).logits.masked_fill(batch["attention_mask"][..., None] == 0, -1e9)
        model.get_output_embeddings().bias -= torch.quantile(logits.amax(dim=1).flatten(), 1 - nonzero)
    model.save_pretrained(str(path), safe_serialization=True)
    SparseEncoder(modules=[MLMTransformer(str(path)), SpladePooling("max", activation)], device="cpu").save(str(path))
    return path


def make_multi_vector_checkpoint(
    path: Path, *, attend: bool = False, strategy: str = "fixed", dim: int = 16, bias: bool = False, seed: int = 0
) -> Path:
    """A ColBERT checkpoint in path, saved by sentence-transformers as a MultiVectorEncoder: random tiny BERT weights
    with MiniLM's WordPiece vocabulary, a Dense projection to `dim`, PyLate's punctuation skiplist on documents,
    [unused0] / [unused1] prompts and query expansion to 16 tokens (`strategy`, `attend`). The folder."""
    import string

    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    tokenizer = family_tokenizer("bert", VOCABULARY)
    fields = {"vocab_size": tokenizer.get_vocab_size(), **config_token_ids(tokenizer, "bert"), **TINY["bert"]}
    torch.manual_seed(seed)
    backbone = path / "backbone"
    transformers.AutoModel.from_config(transformers.AutoConfig.for_model("bert", **fields)).save_pretrained(backbone)
    save_tokenizer(tokenizer, "bert", backbone, MAX_TOKENS)
    expansion = {"strategy": strategy, "attend": attend, "length": 16}
    modules = [
        Transformer(str(backbone), query_expansion=expansion, document_length=40),
        Dense(
            LAYERS["hidden_size"],
            dim,
            bias=bias,
            module_input_name="token_embeddings",
            activation_function=torch.nn.Identity(),
        ),
        MultiVectorMask(list(string.punctuation)),
        Normalize(module_input_name="token_embeddings"),
    ]
    prompts = {"query": "[unused0] ", "document": "[unused1] "}
    MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu").save(str(path))
    return path


def make_hybrid_checkpoint(path: Path, *, seed: int = 0) -> Path:
    """A BGE-M3 checkpoint in path, laid out as BAAI/bge-m3's: tiny random XLM-RoBERTa weights with a trained
    Unigram tokenizer, its CLS embedder modules, and beside them FlagEmbedding's two heads, sparse_linear.pt
    (hidden -> 1) and colbert_linear.pt (hidden -> hidden), as torch.save'd state dicts. The folder."""
    make_checkpoint(path, "xlm-roberta", "embedding", pooling="cls", seed=seed)
    hidden = ROBERTA["hidden_size"]
    torch.manual_seed(seed + 1)
    for name, width in (("sparse_linear.pt", 1), ("colbert_linear.pt", hidden)):
        torch.save(torch.nn.Linear(hidden, width).state_dict(), path / name)
    return path
