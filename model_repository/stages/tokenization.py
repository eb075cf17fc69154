"""The one place that configures the fast tokenizer: used by the tokenizer stage, export and tests."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Encoding, Tokenizer
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

# A text longer than this many characters per kept token is first encoded from a prefix (encode_truncated).
# English runs about 5 characters a token, so the prefix nearly always holds more tokens than are kept.
PREFIX_CHARS_PER_TOKEN = 16
# Where a prefix may be cut: whitespace to BERT under every normalizer option. Not \v, \f, \x85 or \x1c-\x1f:
# the normalizer drops those as control characters, joining the words on either side.
CUT_CHARS = " \t\n\r"


def load_tokenizer(path: str | Path, max_tokens: int) -> Tokenizer:
    """A Hugging Face fast tokenizer that truncates to max_tokens and never pads.

    Checkpoints often ship tokenizer.json with fixed padding enabled; padding is the engine's business
    (or none at all), so it is switched off here.
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def encode_truncated(tokenizer: Tokenizer, texts: list[str]) -> list[Encoding]:
    """tokenizer.encode_batch(texts) with the same ids, at a cost bounded by the kept tokens, not the text.

    Truncation keeps only the first max_length tokens, yet the tokenizer would normalize and split the
    whole text (0.7 s a megabyte). BERT's normalizer works character by character and its pre-tokenizer
    splits at whitespace, so a prefix cut at whitespace tokenizes every word before the cut exactly as the
    whole text does: once that prefix alone overflows max_length, its truncated ids are the whole text's.
    A text whose prefix does not overflow (mostly whitespace, say) is encoded whole in one more call; one
    without whitespace to cut at goes whole into the first call.
    """
    truncation = tokenizer.truncation
    if not (truncation and _prefix_exact(tokenizer, truncation)):
        return tokenizer.encode_batch(texts)
    prefixes = [_prefix(text, PREFIX_CHARS_PER_TOKEN * truncation["max_length"]) for text in texts]
    # One call for the whole batch: the Rust tokenizer spreads it over its threads.
    encodings = tokenizer.encode_batch(prefixes)
    redo = [
        i
        for i, (text, prefix, encoding) in enumerate(zip(texts, prefixes, encodings, strict=True))
        if len(prefix) < len(text) and not encoding.overflowing
    ]
    if redo:
        for i, encoding in zip(redo, tokenizer.encode_batch([texts[i] for i in redo]), strict=True):
            encodings[i] = encoding
    return encodings


def _prefix_exact(tokenizer: Tokenizer, truncation: dict) -> bool:
    """Whether the argument of encode_truncated holds for this tokenizer (BERT's, truncating on the right)."""
    return (
        truncation["direction"] == "right"
        and isinstance(tokenizer.normalizer, BertNormalizer)
        and isinstance(tokenizer.pre_tokenizer, BertPreTokenizer)
        # Added tokens are matched before the pre-tokenizer splits: one spanning whitespace could span a cut.
        and not any(c in token.content for token in tokenizer.get_added_tokens_decoder().values() for c in CUT_CHARS)
    )


def _prefix(text: str, length: int) -> str:
    """text cut at its last whitespace before `length` characters; the whole text when short or uncuttable."""
    if len(text) <= length:
        return text
    cut = max(text.rfind(char, 0, length) for char in CUT_CHARS)
    return text[:cut] if cut > 0 else text
