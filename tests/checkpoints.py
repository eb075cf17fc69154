"""Tiny checkpoints of every encoder family, saved by the libraries themselves (transformers' save_pretrained, then
sentence-transformers' SentenceTransformer, CrossEncoder, SparseEncoder and MultiVectorEncoder save()): what the
export, engine and server tests serve and hold to transformers and sentence-transformers. No config file is
written here: each is what the installed release writes, so a new release's layout is what the tests read.

    make_checkpoint(tmp_path / "xlmr", "xlm-roberta", "embedding", pooling="cls")

A checkpoint holds random weights of the family's own transformers config class, its task head, and a tokenizer
of the family's real layout trained on the bundled texts (export/tokenizer_training.py; BERT reads MiniLM's
WordPiece vocabulary), so that real sentences tokenize as they would for a real checkpoint of the family.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import transformers

from export.checkpoint import family_tokenizer
from export.onnx_export import VALIDATION_SENTENCES
from export.tokenizer_training import config_token_ids, save_tokenizer

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "modernbert")
LABELS = ("negative", "neutral", "positive")  # a classification checkpoint's id2label
POOLING_MODES = {"mean": "mean", "cls": "cls", "max": "max", "mean_sqrt_len": "mean_sqrt_len_tokens"}  # -> 6.x names
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
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    max_seq_length: int | None = None,
    do_lower_case: bool = False,
    **config_overrides,
) -> Path:
    """A `model_type` checkpoint for `task` (embedding | classification | rerank) in path, tiny unless
    config_overrides say otherwise, saved by sentence-transformers itself: a SentenceTransformer embedder of
    [Transformer, Pooling(`pooling`), Normalize if `normalize`] (with `prompts`, `default_prompt_name`,
    `max_seq_length`, `do_lower_case` as its Transformer and model take them), or a CrossEncoder: a classifier of
    three named labels, or a reranker of one logit whose scores on the validation sentences' pairs spread over about
    +-score_spread (real cross-encoders' reach +-10). The folder."""
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

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
    with tempfile.TemporaryDirectory() as base:  # the Hugging Face model the library then loads and saves
        save_tokenizer(tokenizer, model_type, Path(base), MAX_TOKENS, family_class=False)
        if task == "rerank":
            spread_scores(model, Path(base), score_spread)
        model.save_pretrained(base, safe_serialization=True)
        if task != "embedding":
            CrossEncoder(base, device="cpu").save(str(path))
            return path
        transformer = Transformer(base, max_seq_length=max_seq_length, do_lower_case=do_lower_case)
        modules = [transformer, Pooling(config.hidden_size, pooling_mode=POOLING_MODES[pooling])]
        modules += [Normalize()] if normalize else []
        encoder = SentenceTransformer(
            modules=modules, prompts=prompts, default_prompt_name=default_prompt_name, device="cpu"
        )
        encoder.save(str(path))
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
    save_tokenizer(tokenizer, model_type, path, MAX_TOKENS, family_class=False)
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
    path: Path,
    *,
    attend: bool = False,
    strategy: str = "fixed",
    dim: int = 16,
    bias: bool = False,
    seed: int = 0,
    normalize_last: bool = True,
) -> Path:
    """A ColBERT checkpoint in path, saved by sentence-transformers as a MultiVectorEncoder: random tiny BERT weights
    with MiniLM's WordPiece vocabulary, a Dense projection to `dim`, PyLate's punctuation skiplist on documents,
    [unused0] / [unused1] prompts and query expansion to 16 tokens (`strategy`, `attend`); its MultiVectorMask
    before its Normalize (`normalize_last`, the documented order) or after. The folder."""
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
    save_tokenizer(tokenizer, "bert", backbone, MAX_TOKENS, family_class=False)
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
    ]
    per_token = [MultiVectorMask(list(string.punctuation)), Normalize(module_input_name="token_embeddings")]
    modules += per_token if normalize_last else per_token[::-1]
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
