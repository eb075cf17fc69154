"""A trained tokenizer saved into a checkpoint folder (export/tokenizer_training.py's save_tokenizer) loads in
transformers as the family's tokenizer class, and in sentence-transformers' SentenceTransformer and
CrossEncoder beside a random model of that family, with the ids and token types the stages give."""

from __future__ import annotations

import warnings

import pytest
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from tokenizers import Tokenizer

from export.tokenizer_training import FAMILIES, LAYOUTS, config_token_ids, save_tokenizer
from tests.model.test_tokenizer_layouts import hf_tokenizer, trained, training_texts

# Texts the loaders could get wrong: added and special tokens inside text, whitespace runs, other scripts.
TRICKY = [
    "",
    "a <mask> b [MASK] c",
    "x  y   z\t\nw",
    " lead and trail ",
    "naïve café über Straße",
    "東京は日本の首都です。",
    "Привет, мир!",
    "ﬁne ① e\u0301",
    "<s> </s> [CLS] [SEP] <pad>",
]
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37}


@pytest.fixture(scope="module", params=LAYOUTS)
def checkpoint(request, tmp_path_factory):
    """(family, folder): a random two-label classifier of the family (a CrossEncoder's shape) and its tokenizer."""
    family = request.param
    folder = save_tokenizer(Tokenizer.from_str(trained(family)), family, tmp_path_factory.mktemp(family), 128)
    vocabulary = Tokenizer.from_str(trained(family)).get_vocab_size()
    config = transformers.AutoConfig.for_model(
        family, vocab_size=vocabulary, num_labels=1, **TINY, **config_token_ids(hf_tokenizer(family, None), family)
    )
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    return family, folder


def test_transformers_loads_the_familys_class_with_the_same_ids(checkpoint):
    family, folder = checkpoint
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(loaded).__name__ == FAMILIES[family].tokenizer_class.replace(
        "PreTrainedTokenizerFast", "TokenizersBackend"
    )
    reference = hf_tokenizer(family, None)
    texts = training_texts()[::7] + TRICKY
    assert [loaded(text)["input_ids"] for text in texts] == [e.ids for e in reference.encode_batch(texts)]
    pair = loaded(texts[0], texts[1])
    expected = reference.encode(texts[0], texts[1])
    assert pair["input_ids"] == expected.ids
    assert ("token_type_ids" in pair) == FAMILIES[family].token_types
    if FAMILIES[family].token_types:
        assert pair["token_type_ids"] == expected.type_ids


def test_sentence_transformers_tokenize_as_the_stages(checkpoint):
    family, folder = checkpoint
    texts = [*TRICKY, *training_texts()[:20]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no sentence-transformers config: mean pooling, said in a warning
        embedder = SentenceTransformer(str(folder), device="cpu")
        reranker = CrossEncoder(str(folder), device="cpu")
    stage = hf_tokenizer(family, embedder.max_seq_length)
    features = embedder.tokenize(texts)
    ids = [
        row[mask.bool()].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]
    assert ids == [e.ids for e in stage.encode_batch(texts)]
    assert embedder.encode(texts).shape == (len(texts), TINY["hidden_size"])
    pairs = [(texts[1], texts[4]), (texts[2], texts[-1])]
    assert reranker.predict(pairs).shape == (len(pairs),)
    batch = reranker.tokenizer([q for q, _ in pairs], [t for _, t in pairs], padding=True)
    reference = stage.encode_batch(pairs)
    for row, mask, expected in zip(batch["input_ids"], batch["attention_mask"], reference, strict=True):
        assert [i for i, m in zip(row, mask, strict=True) if m] == expected.ids
