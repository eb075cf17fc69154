"""How every part of the project opens a checkpoint's tokenizer: export, the stages, the corpus tools."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


def load_tokenizer(path: str | Path, max_tokens: int) -> Tokenizer:
    """A Hugging Face fast tokenizer that truncates to max_tokens and never pads.

    Checkpoints often ship tokenizer.json with fixed padding enabled; padding is the engine's business
    (or none at all), so it is switched off here.
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer
