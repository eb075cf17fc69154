"""Tokenizers of every encoder family, trained offline from texts given: test checkpoints and random-init models
get a tokenizer laid out as the family's real checkpoints ship theirs, without a download.

    tokenizer = train_tokenizer("roberta", texts, vocab_size=4000)
    save_tokenizer(tokenizer, "roberta", folder)  # AutoTokenizer, SentenceTransformer, CrossEncoder load it

Each layout is what transformers 5 builds for the family's tokenizer class, since it rebuilds a tokenizer.json's
normalizer and pre-tokenizer from the class (keeping only the vocabulary, merges and post-processor): laid out
otherwise, a tokenizer.json would tokenize differently there than in the stages.

Training is deterministic, so every run of an export gets the same ids. The tokenizers library's BpeTrainer is
(its alphabet is sorted, its merges break ties by symbol id); its WordPieceTrainer numbers ## continuations in
hash-map order and its UnigramTrainer sums floats in that order, so both differ from run to run. WordPiece and
Unigram vocabularies are therefore learned with BpeTrainer too: WordPiece's ## continuations as characters of
their own (what WordPieceTrainer does, numbered in order), Unigram's pieces scored by their log frequency in the
BPE segmentation of the training words.

train_sentencepiece_tokenizer makes the tokenizer.json of real XLM-R and CamemBERT checkpoints instead, with
SentencePiece's compiled character map (the Precompiled normalizer) that the layouts above leave out: the test
suite and bench/tokenizer_paths.py hold the stages to it. It needs sentencepiece (the dev extras), so no export
calls it.
"""

from __future__ import annotations

import base64
import io
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

# A few hundred lines in a dozen languages and scripts, to train on beside English (loadtest/corpus.txt), so
# that a vocabulary holds pieces of non-Latin scripts too.
MULTILINGUAL_SENTENCES = Path(__file__).with_name("multilingual_sentences.txt")

ROBERTA_SPECIAL = {"bos": "<s>", "eos": "</s>", "sep": "</s>", "cls": "<s>", "unk": "<unk>", "pad": "<pad>"}
BERT_SPECIAL = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
# ModernBERT's OLMo-derived vocabulary: these two before the learned pieces; after them runs of 24 down to 2
# spaces as tokens of their own, then MODERNBERT_LAST, MODERNBERT_SPECIAL_LAST and [MASK].
MODERNBERT_FIRST = ["|||IP_ADDRESS|||", "<|padding|>"]
MODERNBERT_LAST = ["|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||"]
MODERNBERT_SPECIAL_LAST = ["<|endoftext|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]"]
# WordPiece training marks a character inside a word with a private-use code point of its own (CONTINUATION + n).
CONTINUATION = 0xF0000


@dataclass(frozen=True)
class Family:
    """How a family's checkpoints ship their tokenizer."""

    tokenizer_class: str  # tokenizer_config.json's: the class AutoTokenizer instantiates
    train: Callable[[Iterable[str], int], Tokenizer]  # texts, vocab_size -> the tokenizer, no post-processor
    finish: Callable[[Tokenizer], None]  # added tokens after the learned ones, the post-processor
    special: dict[str, str]  # transformers' special token names (less _token) -> token
    token_types: bool = False  # whether the model takes token_type_ids
    options: dict = field(default_factory=dict)  # other tokenizer_config.json entries its class reads


def _bpe_trained(lines: Iterable[str], vocab_size: int, special: list[str]) -> Tokenizer:
    """A character-level BPE learned by BpeTrainer from lines of words separated by spaces."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer


def _words(tokenizer: Tokenizer, texts: Iterable[str]) -> list[list[str]]:
    """Each text's words as the tokenizer's normalizer and pre-tokenizer make them (what its trainer would see)."""
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer else str
    return [[word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalize(text))] for text in texts]


def _wordpiece(special: list[str]) -> Callable[[Iterable[str], int], Tokenizer]:
    """BERT's: lowercasing BertNormalizer, BertPreTokenizer, WordPiece with ## continuations and [UNK]."""

    def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix="##")
        words = _words(tokenizer, texts)
        inside = sorted({char for line in words for word in line for char in word[1:]})
        if any(ord(char) >= CONTINUATION for char in inside):
            raise ValueError("the training texts hold private-use characters of planes 15-16")
        mark = {char: chr(CONTINUATION + n) for n, char in enumerate(inside)}
        unmark = {marked: char for char, marked in mark.items()}
        lines = (" ".join(word[0] + "".join(mark[c] for c in word[1:]) for word in line) for line in words)
        learned = _bpe_trained(lines, vocab_size, special).get_vocab()

        def piece(token: str) -> str:
            if token[0] in unmark:
                return "##" + "".join(unmark[c] for c in token)
            return token[0] + "".join(unmark[c] for c in token[1:])

        vocab = {piece(token) if token not in special else token: index for token, index in learned.items()}
        tokenizer.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
        tokenizer.add_special_tokens(special)
        return tokenizer

    return train


def _byte_level(
    special: list[str], normalizer: normalizers.Normalizer | None = None
) -> Callable[[Iterable[str], int], Tokenizer]:
    """GPT-2's byte-level BPE (RoBERTa's; ModernBERT's with OLMo's NFC): every byte is in the vocabulary."""

    def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
        tokenizer = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        if normalizer is not None:
            tokenizer.normalizer = normalizer
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer)
        return tokenizer

    return train


def _unigram(special: list[str]) -> Callable[[Iterable[str], int], Tokenizer]:
    """SentencePiece Unigram as XLMRobertaTokenizer and CamembertTokenizer build it in transformers 5: words split
    at whitespace, each given a leading ▁. No normalizer: the real checkpoints' is SentencePiece's compiled
    character map, which only sentencepiece makes, and those classes drop any other (an NFKC one here would
    make the stages and transformers disagree on the texts NFKC changes). Pieces in SentencePiece's order:
    the special ones (score 0), then by score."""

    def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
        )
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        lines = [" ".join(line) for line in _words(tokenizer, texts)]
        bpe = _bpe_trained(lines, vocab_size, special)
        counts = Counter(
            token for encoding in bpe.encode_batch(lines, add_special_tokens=False) for token in encoding.tokens
        )
        total = sum(counts.values())
        # A piece the segmentation never ends on (an intermediate merge) counts half.
        scores = {piece: math.log(counts.get(piece, 0.5) / total) for piece in bpe.get_vocab() if piece not in special}
        pieces = [(token, 0.0) for token in special] + sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        tokenizer.model = models.Unigram(pieces, unk_id=special.index("<unk>"), byte_fallback=False)
        tokenizer.add_special_tokens(special)
        return tokenizer

    return train


def _mask(content: str) -> AddedToken:
    """The mask token as the families add it: it takes the whitespace before it."""
    return AddedToken(content, lstrip=True, rstrip=False, normalized=False, special=True)


def _bert_pairs(tokenizer: Tokenizer) -> None:
    """`[CLS] A [SEP] B [SEP]`, token types 0 up to the first [SEP] and 1 after it."""
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")],
    )


def _roberta_pairs(processing: str) -> Callable[[Tokenizer], None]:
    """`<s> A </s></s> B </s>`, token types all 0: RobertaProcessing (RoBERTa, MPNet) or the same as a template
    (XLM-R, CamemBERT); <mask> after the learned vocabulary, its last id, as the families have it."""

    def finish(tokenizer: Tokenizer) -> None:
        tokenizer.add_special_tokens([_mask("<mask>")])
        cls, sep = ("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))
        if processing == "roberta":
            tokenizer.post_processor = processors.RobertaProcessing(sep, cls, trim_offsets=True, add_prefix_space=False)
        else:
            tokenizer.post_processor = processors.TemplateProcessing(
                single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[cls, sep]
            )

    return finish


def _modernbert_finish(tokenizer: Tokenizer) -> None:
    spaces = [AddedToken(" " * n, normalized=True, special=False) for n in range(24, 1, -1)]
    tokenizer.add_tokens(spaces + [AddedToken(t, normalized=True, special=False) for t in MODERNBERT_LAST])
    special = [AddedToken(t, normalized=False, special=True) for t in MODERNBERT_SPECIAL_LAST]
    tokenizer.add_special_tokens([*special, _mask("[MASK]")])
    _bert_pairs(tokenizer)


BERT_WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FAMILIES = {
    "bert": Family(
        "BertTokenizer", _wordpiece(BERT_WORDPIECE), _bert_pairs, BERT_SPECIAL, True, {"do_lower_case": True}
    ),
    "distilbert": Family(
        "DistilBertTokenizer", _wordpiece(BERT_WORDPIECE), _bert_pairs, BERT_SPECIAL, False, {"do_lower_case": True}
    ),
    # MPNet's vocabulary: <s> <pad> </s> <unk> first, then BERT's WordPiece pieces ([UNK] among them), <mask> last.
    "mpnet": Family(
        "MPNetTokenizer",
        _wordpiece(["<s>", "<pad>", "</s>", "<unk>", "[UNK]"]),
        _roberta_pairs("roberta"),
        {**ROBERTA_SPECIAL, "unk": "[UNK]", "mask": "<mask>"},
        options={"do_lower_case": True},
    ),
    "roberta": Family(
        "RobertaTokenizer",
        _byte_level(["<s>", "<pad>", "</s>", "<unk>"]),
        _roberta_pairs("roberta"),
        {**ROBERTA_SPECIAL, "mask": "<mask>"},
        options={"add_prefix_space": False, "trim_offsets": True},
    ),
    "xlm-roberta": Family(
        "XLMRobertaTokenizer",
        _unigram(["<s>", "<pad>", "</s>", "<unk>"]),
        _roberta_pairs("template"),
        {**ROBERTA_SPECIAL, "mask": "<mask>"},
        options={"add_prefix_space": True},
    ),
    # camembert-base is SentencePiece too (not byte-level BPE), its first ids fairseq's.
    "camembert": Family(
        "CamembertTokenizer",
        _unigram(["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>"]),
        _roberta_pairs("template"),
        {**ROBERTA_SPECIAL, "mask": "<mask>"},
        options={"add_prefix_space": True, "additional_special_tokens": ["<s>NOTUSED", "</s>NOTUSED", "<unk>NOTUSED"]},
    ),
    # answerdotai/ModernBERT-base: OLMo's byte-level BPE (NFC), BERT's special tokens and pair template.
    "modernbert": Family(
        "PreTrainedTokenizerFast",
        _byte_level(MODERNBERT_FIRST, normalizers.NFC()),
        _modernbert_finish,
        BERT_SPECIAL,
        options={"clean_up_tokenization_spaces": True},
    ),
}
LAYOUTS = tuple(FAMILIES)


def train_tokenizer(family: str, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A tokenizer of `family`'s layout (one of LAYOUTS), its vocabulary of vocab_size learned from texts (plus
    the tokens the family adds after it), deterministically. No padding, no truncation."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; known: {', '.join(LAYOUTS)}")
    spec = FAMILIES[family]
    tokenizer = spec.train(texts, vocab_size)
    spec.finish(tokenizer)
    return tokenizer


# SentencePiece tokenizers as real checkpoints ship them (layout -> transformers' tokenizer class): what
# transformers 5 builds from a sentencepiece.bpe.model (the character map alone, then WhitespaceSplit and
# Metaspace: xlm-roberta-base's layout), and the tokenizer.json that transformers 4's XLMRobertaConverter wrote
# for multilingual-e5, bge-m3 and bge-reranker-v2-m3 (the map then a Replace of runs of spaces, then Metaspace).
SENTENCEPIECE_LAYOUTS = {
    "xlm-roberta-spm": "XLMRobertaTokenizer",
    "camembert-spm": "CamembertTokenizer",
    "xlm-roberta-spm-json": "XLMRobertaTokenizer",
}


def train_sentencepiece_tokenizer(layout: str, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A tokenizer of `layout` (one of SENTENCEPIECE_LAYOUTS): a SentencePiece Unigram model of at most
    vocab_size pieces learned from texts with XLM-R's normalization (nmt_nfkc, its character map), converted by
    transformers as it converts a checkpoint's sentencepiece.bpe.model. Deterministic (one thread)."""
    import sentencepiece  # the dev extras: exports never call this
    import transformers

    if layout not in SENTENCEPIECE_LAYOUTS:
        raise ValueError(f"unknown SentencePiece layout {layout!r}; known: {', '.join(SENTENCEPIECE_LAYOUTS)}")
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type="unigram",
        normalization_rule_name="nmt_nfkc",
        num_threads=1,
        minloglevel=2,
    )
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "sentencepiece.bpe.model").write_bytes(model.getvalue())
        converted = getattr(transformers, SENTENCEPIECE_LAYOUTS[layout]).from_pretrained(folder)
    tokenizer = Tokenizer.from_str(converted.backend_tokenizer.to_str())
    if layout == "xlm-roberta-spm-json":
        charsmap = json.loads(tokenizer.normalizer.__getstate__())["precompiled_charsmap"]
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Precompiled(base64.b64decode(charsmap)), normalizers.Replace(Regex(" {2,}"), " ")]
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


def config_token_ids(tokenizer: Tokenizer, family: str) -> dict[str, int]:
    """The special token ids a transformers config of `family` names, read off the tokenizer: pad_token_id, and
    bos/eos where the family has them (ModernBERT's config calls [CLS] and [SEP] bos and eos too, and names
    cls_token_id and sep_token_id). The configs' defaults are the real vocabularies' ids, which a trained one
    does not share."""
    special = FAMILIES[family].special
    if family == "modernbert":
        names = {"pad": "pad", "bos": "cls", "eos": "sep", "cls": "cls", "sep": "sep"}
    else:
        names = {name: name for name in ("pad", "bos", "eos") if name in special}
    return {f"{name}_token_id": tokenizer.token_to_id(special[token]) for name, token in names.items()}


def save_tokenizer(
    tokenizer: Tokenizer, family: str, folder: str | Path, max_tokens: int = 512, family_class: bool = True
) -> Path:
    """Save the tokenizer into folder (made if missing) through transformers itself, as `family`'s tokenizer class
    with its special tokens and inputs, so that AutoTokenizer (and sentence-transformers' SentenceTransformer and
    CrossEncoder beside a model of that family) loads that class with the tokenizer's own ids; max_tokens is its
    model_max_length. tokenizer.json is the tokenizer's, unchanged. family_class False: as transformers' generic
    PreTrainedTokenizerFast without the class's options (do_lower_case, ...), so that tokenizer.json alone decides.
    Returns the folder."""
    import transformers

    spec = FAMILIES[family]
    missing = [token for token in spec.special.values() if tokenizer.token_to_id(token) is None]
    if missing:
        raise ValueError(f"the tokenizer has no {', '.join(missing)}: it is not of the {family} layout")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    inputs = ["input_ids", *(["token_type_ids"] if spec.token_types else []), "attention_mask"]
    special = {f"{name}_token": token for name, token in spec.special.items()}
    kind, options = (
        (getattr(transformers, spec.tokenizer_class), spec.options)
        if family_class
        else (transformers.PreTrainedTokenizerFast, {})
    )
    saved = kind(
        tokenizer_object=tokenizer, model_max_length=max_tokens, model_input_names=inputs, **special, **options
    )
    saved.save_pretrained(str(folder))
    return folder
