"""The base every writer environment builds its checkpoints on, made once by the main environment: per family a
tokenizer.json of the family's layout (export/checkpoint.py's family_tokenizer) and family.json, the arguments of
the family's transformers classes (the tokenizer class with its special tokens, the tiny config's fields), so that
the writers need nothing of this repository.

    .venv/bin/python -m tests.compat.base_tokenizers build/compat/tokenizers
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from export.checkpoint import family_tokenizer
from export.tokenizer_training import FAMILIES, config_token_ids
from tests.checkpoints import MAX_TOKENS, MODEL_TYPES, TINY, VOCABULARY


def write(out: Path) -> None:
    for model_type in MODEL_TYPES:
        folder = out / model_type
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer = family_tokenizer(model_type, VOCABULARY)
        tokenizer.save(str(folder / "tokenizer.json"))
        family = FAMILIES[model_type]
        fields = {"vocab_size": tokenizer.get_vocab_size(), **config_token_ids(tokenizer, model_type)}
        spec = {
            "tokenizer_class": family.tokenizer_class,
            "tokenizer_kwargs": {
                **{f"{name}_token": token for name, token in family.special.items()},
                **family.options,
                "model_input_names": [
                    "input_ids",
                    *(["token_type_ids"] if family.token_types else []),
                    "attention_mask",
                ],
                "model_max_length": MAX_TOKENS,
            },
            "config": {**fields, **TINY[model_type]},
        }
        (folder / "family.json").write_text(json.dumps(spec, indent=2) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
