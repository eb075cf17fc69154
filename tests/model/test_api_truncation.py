"""What the API front does to texts before the stages see them (serving/api/routes_tei.prepared and
serving/api/truncation.py): TEI's prompt_name, truncation_direction Left and truncate false, Cohere's input_type
and truncate, against the
Hugging Face tokenizer's own left truncation on the default model's tokenizer, and on byte-level BPE and
Unigram tokenizers (trained in tests/model/test_tokenizer_layouts.py) in its place."""

from __future__ import annotations

import dataclasses

import pytest
from tokenizers import Tokenizer, processors

from serving.api.models import served_model
from serving.api.routes_cohere import read_as_asked
from serving.api.routes_tei import prepared
from serving.api.schema import ApiError, cohere_embed_request
from serving.api.truncation import keep_first
from settings import Deployment
from tests.model.test_tokenizer_layouts import hf_tokenizer


@pytest.fixture(scope="module")
def model(settings, repository):
    served = served_model(Deployment((settings,)), settings, repository)
    return dataclasses.replace(served, prompts={"query": "query: ", "passage": "passage: "})


def left_truncated(model, text: str) -> list[int]:
    """The ids the Hugging Face tokenizer keeps truncating from the left to max_tokens."""
    tokenizer = Tokenizer.from_str(model.whole.to_str())
    tokenizer.enable_truncation(model.max_tokens, direction="left")
    return tokenizer.encode(text).ids


def ids(model, text: str) -> list[int]:
    return model.tokenizer.encode(text).ids


def test_prompt_name_puts_the_checkpoints_prompt_in_front(model):
    assert prepared(model, [b"what is triton"], {"prompt_name": "query"}) == [b"query: what is triton"]
    with pytest.raises(ApiError, match=r"'prompt_name' 'title' is not one of the model's prompts \(passage, query\)"):
        prepared(model, [b"x"], {"prompt_name": "title"})


def test_left_truncation_keeps_the_tokens_the_tokenizer_keeps_from_the_left(model, sentences):
    text = " ".join(sentences)  # far over max_tokens; words of one token and of several
    assert len(model.whole.encode(text).ids) > 2 * model.max_tokens
    (cut,) = prepared(model, [text.encode()], {"truncation_direction": "Left"})
    kept, reference = ids(model, cut.decode()), left_truncated(model, text)
    # The cut goes at a word's start: a word the left truncation splits is dropped whole, so what is kept is
    # the reference without at most that word's leading pieces.
    assert kept[0] == reference[0] and kept[-1] == reference[-1]
    assert kept[1:] == reference[len(reference) - len(kept) + 1 :]
    assert len(reference) - len(kept) <= 4


def test_left_truncation_of_one_token_words_is_exactly_the_tokenizers(model):
    text = " ".join(["hello"] * 300) + " and this ending"
    (cut,) = prepared(model, [text.encode()], {"truncation_direction": "left"})
    assert ids(model, cut.decode()) == left_truncated(model, text)


def test_truncate_false_refuses_the_text_over_the_limit_by_its_index(model):
    short, long = "a short text", " ".join(["hello"] * 300)
    assert prepared(model, [short.encode()], {"truncate": False}) == [short.encode()]
    with pytest.raises(ApiError, match=r"'inputs\[1\]' has 302 tokens; the model takes at most 256") as refused:
        prepared(model, [short.encode(), long.encode()], {"truncate": False})
    assert refused.value.status == 413


def test_texts_within_the_limit_pass_unchanged(model):
    texts = [b"Triton batches requests.", "caf\u00e9 \u00fcber".encode()]
    assert prepared(model, texts, {"truncation_direction": "Left"}) == texts
    assert prepared(model, texts, {}) is texts


def test_max_tokens_per_doc_keeps_each_documents_first_tokens_at_a_word_start(model, sentences):
    text = " ".join(sentences[:20])
    for tokens in (5, 17, 64):
        (cut,) = keep_first(model, [text], tokens)
        kept = model.whole.encode(cut, add_special_tokens=False).ids
        first = model.whole.encode(text, add_special_tokens=False).ids[:tokens]
        # At most the pieces of the word the limit splits are dropped, never a token past the limit kept.
        assert kept == first[: len(kept)] and tokens - 4 <= len(kept) <= tokens
    assert keep_first(model, ["short text"], 5) == ["short text"]


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta", "without special tokens"])
def other_model(request, model):
    """The served model with a byte-level BPE or Unigram tokenizer, or one that adds no special tokens."""
    name = "roberta" if request.param == "without special tokens" else request.param
    tokenizer, whole = hf_tokenizer(name, model.max_tokens), hf_tokenizer(name, None)
    if request.param == "without special tokens":
        for each in (tokenizer, whole):
            each.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    return dataclasses.replace(model, tokenizer=tokenizer, whole=whole)


def test_left_truncation_cuts_bpe_and_unigram_texts_at_a_word_start(other_model, sentences):
    text = " ".join(sentences)
    (cut,) = prepared(other_model, [text.encode()], {"truncation_direction": "Left"})
    kept, reference = ids(other_model, cut.decode()), left_truncated(other_model, text)
    specials = other_model.whole.num_special_tokens_to_add(False)
    assert len(reference) == other_model.max_tokens and len(reference) - len(kept) <= 8
    # What is kept is the reference's end: only the pieces of the word the left truncation splits are dropped.
    assert kept[: specials // 2] == reference[: specials // 2]
    assert kept[specials // 2 :] == reference[len(reference) - len(kept) + specials // 2 :]


def test_left_truncation_of_bpe_and_unigram_one_token_words_is_exactly_the_tokenizers(other_model):
    text = " ".join(["value"] * 300) + " and the return"
    (cut,) = prepared(other_model, [text.encode()], {"truncation_direction": "left"})
    assert ids(other_model, cut.decode()) == left_truncated(other_model, text)


def test_max_tokens_per_doc_cuts_bpe_and_unigram_documents_at_a_word_start(other_model, sentences):
    text = " ".join(sentences[:20])
    for tokens in (5, 17, 64):
        (cut,) = keep_first(other_model, [text], tokens)
        kept = other_model.whole.encode(cut, add_special_tokens=False).ids
        first = other_model.whole.encode(text, add_special_tokens=False).ids[:tokens]
        assert kept == first[: len(kept)] and tokens - 8 <= len(kept) <= tokens


def test_cohere_input_types_read_the_checkpoints_prompts_and_truncate_as_asked(model):
    def asked(texts: list[str], **fields) -> list[bytes]:
        return read_as_asked(model, cohere_embed_request({"texts": texts, **fields}, model.limits, "2"))

    assert asked(["what is triton"], input_type="search_query") == [b"query: what is triton"]
    assert asked(["Triton batches."], input_type="search_document") == [b"passage: Triton batches."]
    assert asked(["as is"], input_type="clustering") == [b"as is"], "a prompt the checkpoint lacks: none"
    long = " ".join(["hello"] * 300) + " and this ending"
    assert asked([long], truncate="END") == [long.encode()], "the stages keep its first tokens"
    (cut,) = asked([long], truncate="START")
    assert ids(model, cut.decode()) == left_truncated(model, long)
    with pytest.raises(ApiError, match=r"'texts\[1\]' has 305 tokens; .* at most 256 \(truncate is NONE\)") as refused:
        asked(["short", long], truncate="NONE")
    assert refused.value.status == 400 and refused.value.param == "texts[1]"
