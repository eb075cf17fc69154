"""python -m bench.stack_summary FILE: where a py-spy profile (collapsed stacks, `--format raw`) spends its time.

Prints, per function, the share of samples in which it is on the stack (inclusive) and on top (self), so a
stub's time can be split into tokenizing, the engine, building responses and waiting.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>[^ ]+) \((?P<file>[^:)]+)(?::\d+)?\)$")


def summarize(text: str) -> tuple[int, Counter, Counter]:
    """(samples, inclusive counts, self counts) per 'function (file)' from collapsed stacks."""
    total, inclusive, own = 0, Counter(), Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = []
        for frame in stack.split(";"):
            match = _FRAME.match(frame.strip())
            frames.append(f"{match['function']} ({Path(match['file']).name})" if match else frame.strip())
        for frame in set(frames):
            inclusive[frame] += samples
        own[frames[-1]] += samples
    return total, inclusive, own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stack_summary", description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    total, inclusive, own = summarize(args.profile.read_text())
    print(f"{total} samples")
    print(f"{'inclusive':>9} {'self':>6}  function")
    for frame, count in inclusive.most_common(args.top):
        print(f"{100 * count / total:8.1f}% {100 * own[frame] / total:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
