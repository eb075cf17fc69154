"""The special tokens a tokenizer's post-processor puts around a text and around a pair, the pair's token types,
and how much of each side of a pair longest-first truncation keeps: what the ASCII fast path does after it
has a text's ids. Read from the post-processor's configuration, for the post-processors whose output does not
depend on the texts (BERT's, RoBERTa's and templates)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from .prefix_encoding import state


def longest_first(first: int, second: int, room: int) -> tuple[int, int]:
    """How many tokens of each side of a pair the Hugging Face tokenizer keeps when truncating longest first
    to `room` (max_length less the special tokens): the shorter side whole if the longer still gets at least
    as much, else the room split in halves, the second side taking the odd one."""
    if first + second <= room:
        return first, second
    short, long = sorted((first, second))
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short = room // 2
        long = short + room % 2
    return (long, short) if first > second else (short, long)


@dataclass(frozen=True)
class Template:
    """The special token ids around a text and a pair, and the pair's token types."""

    before: tuple[int, ...]  # a text: [CLS] (<s>) ...
    after: tuple[int, ...]  # ... [SEP] (</s>)
    pair: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # a pair: before, between and after its sides
    pair_types: tuple[tuple[int, ...], int, tuple[int, ...], int, tuple[int, ...]]  # the same, each side one type

    @property
    def single_specials(self) -> int:
        return len(self.before) + len(self.after)

    @property
    def pair_specials(self) -> int:
        return sum(map(len, self.pair))

    def wrap(self, ids: list[int]) -> list[int]:
        return [*self.before, *ids, *self.after]

    def wrap_pair(self, first: list[int], second: list[int]) -> tuple[list[int], list[int]]:
        """(ids, token types) of a pair."""
        start, between, end = self.pair
        start_types, first_type, between_types, second_type, end_types = self.pair_types
        ids = [*start, *first, *between, *second, *end]
        types = [*start_types, *[first_type] * len(first), *between_types, *[second_type] * len(second), *end_types]
        return ids, types


def _segments(items: list[dict], specials: dict[str, list[int]]) -> tuple[list[list[int]], list[list[int]], list]:
    """A TemplateProcessing template's (ids and types of the special tokens before, between and after its
    sequences, and each sequence's (name, type)) in order."""
    ids, types, sequences = [[]], [[]], []
    for item in items:
        if "Sequence" in item:
            sequences.append((item["Sequence"]["id"], item["Sequence"]["type_id"]))
            ids.append([])
            types.append([])
        else:
            token = item["SpecialToken"]
            ids[-1] += specials[token["id"]]
            types[-1] += [token["type_id"]] * len(specials[token["id"]])
    return ids, types, sequences


def special_template(tokenizer: Tokenizer) -> Template | None:
    """The tokenizer's Template, or None for a post-processor whose special tokens depend on the texts (or one
    not known here)."""
    config = state(tokenizer.post_processor)
    if config is None:  # no post-processor: a pair is its two sides, typed 0 and 1
        return Template((), (), ((), (), ()), ((), 0, (), 1, ()))
    kind = config["type"]
    if kind in ("RobertaProcessing", "BertProcessing"):
        cls, sep = (config["cls"][1],), (config["sep"][1],)
        if kind == "RobertaProcessing":  # <s> A </s></s> B </s>, all of type 0
            return Template(cls, sep, (cls, sep * 2, sep), ((0,), 0, (0, 0), 0, (0,)))
        return Template(cls, sep, (cls, sep, sep), ((0,), 0, (0,), 1, (1,)))
    if kind != "TemplateProcessing":
        return None
    specials = {name: token["ids"] for name, token in config["special_tokens"].items()}
    single, _, single_sequences = _segments(config["single"], specials)
    pair, types, pair_sequences = _segments(config["pair"], specials)
    if [name for name, _ in single_sequences] != ["A"] or [name for name, _ in pair_sequences] != ["A", "B"]:
        return None
    (_, first_type), (_, second_type) = pair_sequences
    return Template(
        tuple(single[0]),
        tuple(single[1]),
        (tuple(pair[0]), tuple(pair[1]), tuple(pair[2])),
        (tuple(types[0]), first_type, tuple(types[1]), second_type, tuple(types[2])),
    )
