"""A cross-encoder reranker on its own, no server: pairs tokenized as the Hugging Face tokenizer tokenizes them
(token types, [SEP] between, longest-first truncation), in the ASCII fast path too; both CPU engines score
them as sentence-transformers' CrossEncoder does (sigmoid of the one logit); the export's ONNX takes token
types as a third input."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest

from common.contract import TOKEN_TYPES, ServingSpec
from loadtest.corpus import load_text
from model_repository.stages.engines import load_engine
from model_repository.stages.text_tokenizer import TextTokenizer, longest_first

WORDS = "the quick brown fox jumps over a lazy dog in triton's server, with 42 GPUs; batching!".split()


def reference_pairs(tokenizer: TextTokenizer, queries: list[str], texts: list[str]) -> tuple[list, list]:
    encodings = tokenizer.tokenizer.encode_batch(list(zip(queries, texts, strict=True)))
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def packed_pairs(tokenizer: TextTokenizer, queries: list[str], texts: list[str]) -> tuple[list, list]:
    ids, lengths, types = tokenizer.encode_pairs(queries, texts)
    cuts = np.cumsum(lengths)[:-1]
    return [row.tolist() for row in np.split(ids, cuts)], [row.tolist() for row in np.split(types, cuts)]


@pytest.mark.parametrize("max_tokens", [7, 8, 16, 33, 128])
def test_pairs_get_the_hugging_face_ids_and_types_truncated_longest_first(rerank_export, max_tokens):
    """Random word salad of every length against the tokenizer itself: short pairs whole, long ones cut from
    the longer side first, both halves when both are long (odd budgets too), and non-ASCII pairs."""
    tokenizer = TextTokenizer.from_file(rerank_export / "tokenizer.json", max_tokens)
    assert tokenizer._ascii.pairs, "the fast path must be on for BERT's tokenizer"
    rng = random.Random(max_tokens)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(0, 3 * max_tokens))) for _ in range(300)]
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(0, 3 * max_tokens))) for _ in range(300)]
    # The tokenizer's own pair truncation makes every combination of both sides' overflowing windows: the
    # reference stays short enough for that (the cut in encode_pairs_slow is what spares the server).
    queries[:4], texts[:4] = (
        ["Ünïcödé query", "", "a " * 300, "é " * 300],
        ["naïve café text", "", "b " * 301, "ü " * 299],
    )
    assert packed_pairs(tokenizer, queries, texts) == reference_pairs(tokenizer, queries, texts)


@pytest.mark.parametrize(("max_tokens", "kept"), [(7, (2, 2)), (8, (2, 3))])
def test_a_long_non_ascii_pair_is_cut_before_the_tokenizer_truncates_it(rerank_export, max_tokens, kept):
    """Two sides of 50,000 tokens each (the whole pair to the tokenizer: billions of overflow windows): each side
    is cut first, and the longer one (the text) keeps the odd token of an odd room."""
    tokenizer = TextTokenizer.from_file(rerank_export / "tokenizer.json", max_tokens)
    ids, lengths, types = tokenizer.encode_pairs(["é " * 50_000], ["ü " * 50_001])
    cls, sep = tokenizer.tokenizer.encode("").ids
    e, u = (tokenizer.tokenizer.encode(word, add_special_tokens=False).ids[0] for word in ("é", "ü"))
    assert ids.tolist() == [cls, *[e] * kept[0], sep, *[u] * kept[1], sep]
    assert types.tolist() == [0] * (kept[0] + 2) + [1] * (kept[1] + 1) and lengths.tolist() == [max_tokens]


def test_the_corpus_as_pairs_gets_the_hugging_face_ids(rerank_export):
    tokenizer = TextTokenizer.from_file(rerank_export / "tokenizer.json", 128)
    corpus = load_text()[:800]
    queries, texts = corpus[::2], corpus[1::2]
    assert packed_pairs(tokenizer, queries, texts) == reference_pairs(tokenizer, queries, texts)


def test_longest_first_splits_the_room_as_the_tokenizer_does():
    assert longest_first(3, 4, 10) == (3, 4)  # fits
    assert longest_first(3, 20, 10) == (3, 7)  # the longer side gives way
    assert longest_first(20, 3, 10) == (7, 3)
    assert longest_first(20, 20, 9) == (4, 5)  # both long: halves, the odd token to the second
    assert longest_first(30, 20, 9) == (5, 4)  # ... to the longer
    assert longest_first(6, 6, 10) == (5, 5)


def test_the_export_takes_token_types_and_gives_one_logit(rerank_export):
    spec = ServingSpec.load(rerank_export)
    assert spec.task == "rerank" and spec.pairs and spec.output_size == 1 and not spec.labels
    graph = onnx.load(str(rerank_export / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", TOKEN_TYPES]
    assert [d.dim_value or d.dim_param for d in graph.output[0].type.tensor_type.shape.dim] == ["batch", 1]


@pytest.mark.parametrize(("kind", "options"), [("onnxruntime_cpu", {"threads": "2"}), ("torch", {"precision": "fp32"})])
def test_cpu_engines_score_pairs_as_sentence_transformers_cross_encoder(rerank_export, cross_encoder, kind, options):
    """sigmoid(the engine's logit) against CrossEncoder.predict on corpus pairs: within 1e-5, ranked alike."""
    corpus = load_text()[:200]
    queries, texts = [corpus[0]] * 40 + [corpus[1]] * 40 + corpus[2:42], corpus[42:162]
    tokenizer = TextTokenizer.from_file(rerank_export / "tokenizer.json", 128)
    engine = load_engine(kind, rerank_export, "cpu", options)
    logits = engine.forward_packed(*tokenizer.encode_pairs(queries, texts))
    assert logits.shape == (120, 1)
    served = 1.0 / (1.0 + np.exp(-logits[:, 0].astype(np.float64)))
    expected = cross_encoder.predict(list(zip(queries, texts, strict=True)), batch_size=32)
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
    for block in range(3):  # each query's texts in the same order
        rows = slice(40 * block, 40 * block + 40)
        assert list(np.argsort(-served[rows])) == list(np.argsort(-expected[rows]))
