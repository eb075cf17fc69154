"""python -m loadtest.corpus: regenerate loadtest/corpus.txt, the texts every load test and benchmark sends.

The texts are real English prose: sentences from the Python standard library's docstrings (always
installed, no download), joined and cut so their token counts follow a clipped log-normal distribution,
mean ~45 tokens with a tail up to the maximum. Deterministic for a given Python version and seed; the
shipped file was made with CPython 3.11.7 and the default tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import random
import re
import statistics
import warnings
from pathlib import Path

import numpy as np

from common.hf_tokenizer import load_tokenizer
from settings import load_settings

CORPUS = Path(__file__).with_name("corpus.txt")
MODULES = (
    "argparse asyncio collections csv datetime email http.client json logging os pathlib re shutil socket sqlite3 "
    "subprocess threading unittest urllib.request xml.etree.ElementTree zipfile decimal fractions statistics random "
    "string textwrap tarfile tempfile inspect functools itertools heapq bisect calendar time io codecs difflib "
    "doctest ftplib smtplib imaplib mailbox configparser locale gettext pickle copy pprint enum dataclasses "
    "contextlib abc numbers math cmath array queue sched select selectors signal ssl hashlib hmac secrets base64 "
    "binascii struct uuid ipaddress wave colorsys pdb profile timeit trace tracemalloc warnings weakref gc site "
    "sysconfig platform getpass glob fnmatch filecmp fileinput stat mimetypes html html.parser webbrowser wsgiref "
    "xmlrpc.client zlib gzip bz2 lzma"
).split()
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
CODE_LIKE = re.compile(r">>>|::|\(\)|__|==|[{}$\\]")


def load_text(path: Path = CORPUS) -> list[str]:
    return path.read_text().splitlines()


def docstring_sentences() -> list[str]:
    sentences: set[str] = set()
    for name in MODULES:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            docs = [module.__doc__] + [getattr(getattr(module, attr, None), "__doc__", None) for attr in dir(module)]
        for doc in filter(lambda d: isinstance(d, str), docs):
            for paragraph in re.split(r"\n\s*\n", doc):
                for sentence in SENTENCE_END.split(" ".join(paragraph.split())):
                    letters = sum(ch.isalpha() or ch == " " for ch in sentence)
                    if (
                        30 <= len(sentence) <= 400
                        and sentence[0].isupper()
                        and sentence[-1] in ".!?"
                        and not CODE_LIKE.search(sentence)
                        and letters / len(sentence) > 0.85
                    ):
                        sentences.add(sentence)
    return sorted(sentences)


def target_lengths(count: int, mean: float, sigma: float, low: int, high: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2
    return [int(n) for n in np.clip(np.rint(rng.lognormal(mu, sigma, count)), low, high)]


def default_tokenizer():
    from export.checkpoint import tokenizer_file  # imports transformers: keep it out of load_text()'s path

    return load_tokenizer(tokenizer_file(load_settings().model.source), 100_000)


def build(count: int, mean: float, sigma: float, max_tokens: int, seed: int) -> list[str]:
    tokenizer = default_tokenizer()
    sentences = docstring_sentences()
    rng = random.Random(seed)
    texts = []
    for target in target_lengths(count, mean, sigma, 8, max_tokens, seed):
        words: list[str] = []
        while len(tokenizer.encode(" ".join(words)).ids) < target:
            words += rng.choice(sentences).split()
        while len(words) > 1 and len(tokenizer.encode(" ".join(words)).ids) > target:
            words.pop()
        texts.append(" ".join(words))
    return texts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.corpus", description=__doc__)
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--mean-tokens", type=float, default=45.0)
    parser.add_argument("--sigma", type=float, default=0.6, help="log-normal shape; larger means a longer tail")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args(argv)
    texts = build(args.count, args.mean_tokens, args.sigma, args.max_tokens, args.seed)
    args.out.write_text("\n".join(texts) + "\n")
    tokenizer = default_tokenizer()
    lengths = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    print(
        f"{len(texts)} texts -> {args.out}: tokens mean {statistics.mean(lengths):.1f}, "
        f"p50 {statistics.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, max {max(lengths)}"
    )


if __name__ == "__main__":
    main()
