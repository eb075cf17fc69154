"""CallStats: how many texts and how many requests each of the API front's Triton calls carried, per model, and
each priority class's requests by outcome and their time queued in the front (serving/api/priority.py).

Every worker of one front counts its own calls into a small file of counters (a memory map: an increment is a
store, no system call) in a folder its siblings share, `bert-triton-api-<port>-<supervisor pid>` under the
temporary directory. /metrics, answered by any one worker, sums every sibling's file, so a scrape sees the whole
front whichever worker answers it, and a worker that died and was started again keeps its predecessor's counts
(Prometheus counters do not go down while the front runs). The last worker to stop removes the folder; folders of
fronts whose supervisor was killed are removed when a worker starts.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.process_state import running
from settings.schema import PRIORITY_CLASSES

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # then +Inf
_WIDTH = len(BUCKETS) + 1  # counts per bucket, +Inf last
_TEXTS, _TEXTS_SUM, _CALLS = 0, _WIDTH, _WIDTH + 1
_REQUESTS, _REQUESTS_SUM = _WIDTH + 2, 2 * _WIDTH + 2
_ROW = 2 * _WIDTH + 3
OUTCOMES = ("served", "overloaded", "timed_out", "retried")  # a class's row: these counts, then queued microseconds
_QUEUED_US = len(OUTCOMES)
FAMILIES = (
    ("bert_api_call_texts", "Texts per Triton call of the API front (a coalesced call carries several requests)"),
    ("bert_api_call_requests", "API requests per Triton call of the API front (1 without coalescing)"),
)


def _bucket(value: int) -> int:
    return next((index for index, bound in enumerate(BUCKETS) if value <= bound), len(BUCKETS))


class CallStats:
    """This worker's counters for `models` (Triton names, in order) and the priority classes, beside its
    siblings' under `port`."""

    def __init__(self, port: int, models: Sequence[str], root: Path | None = None) -> None:
        root = Path(root or tempfile.gettempdir())
        for folder in root.glob(f"bert-triton-api-{port}-*"):
            supervisor = folder.name.rsplit("-", 1)[1]
            if supervisor.isdigit() and int(supervisor) != os.getppid() and not running(int(supervisor)):
                shutil.rmtree(folder, ignore_errors=True)
        self.folder = root / f"bert-triton-api-{port}-{os.getppid()}"
        self.folder.mkdir(exist_ok=True)
        self.models = list(models)
        self._rows = {name: index for index, name in enumerate(self.models)}
        self._class_rows = {name: len(self.models) + index for index, name in enumerate(PRIORITY_CLASSES)}
        self._shape = (len(self.models) + len(PRIORITY_CLASSES), _ROW)
        size = self._shape[0] * _ROW * 8
        with open(self.folder / f"{os.getpid()}.u64", "w+b") as file:
            file.truncate(size)
            self._map = mmap.mmap(file.fileno(), size)
        # Counters as Python ints over the map: numpy memmap rows cost 15.7 against 1.8 us for one request's
        # two counts (2 cores, docs/results/cpu-2026-12-05/call-stats), on every request.
        self._counts = memoryview(self._map).cast("Q")

    def close(self) -> None:
        """This worker's file goes with it; the last worker to go (no live worker's file left, whatever order they
        stop in) takes its dead predecessors' files and the folder."""
        self._counts.release()
        self._map.close()
        (self.folder / f"{os.getpid()}.u64").unlink(missing_ok=True)
        others = list(self.folder.glob("*.u64"))
        if any(path.stem.isdigit() and running(int(path.stem)) for path in others):
            return
        for path in others:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # a sibling that stops at the same moment removed it first
            self.folder.rmdir()

    def count(self, model: str, texts: int, requests: int) -> None:
        row, counts = self._rows[model] * _ROW, self._counts
        counts[row + _TEXTS + _bucket(texts)] += 1
        counts[row + _TEXTS_SUM] += texts
        counts[row + _CALLS] += 1
        counts[row + _REQUESTS + _bucket(requests)] += 1
        counts[row + _REQUESTS_SUM] += requests

    def count_class(self, priority_class: str, outcome: str, queued_s: float = 0.0) -> None:
        """A request of the class answered with this outcome (OUTCOMES), after queued_s in the Coalescer."""
        row, counts = self._class_rows[priority_class] * _ROW, self._counts
        counts[row + OUTCOMES.index(outcome)] += 1
        counts[row + _QUEUED_US] += int(queued_s * 1e6)

    def totals(self) -> np.ndarray:
        """Every sibling's counters summed (models, then classes x counters)."""
        total = np.zeros(self._shape, np.uint64)
        for path in self.folder.glob("*.u64"):
            counts = np.fromfile(path, np.uint64)
            if counts.size == total.size:  # a file being created is skipped for this scrape
                total += counts.reshape(total.shape)
        return total

    def prometheus(self) -> str:
        """The two histograms in Prometheus' text format, labelled by model, and the classes' counters."""
        totals, lines = self.totals(), []
        for (family, description), (start, total) in zip(
            FAMILIES, ((_TEXTS, _TEXTS_SUM), (_REQUESTS, _REQUESTS_SUM)), strict=True
        ):
            lines += [f"# HELP {family} {description}", f"# TYPE {family} histogram"]
            for model, row in zip(self.models, totals[: len(self.models)], strict=True):
                cumulative = np.cumsum(row[start : start + _WIDTH])
                for bound, count in zip([*map(str, BUCKETS), "+Inf"], cumulative, strict=True):
                    lines.append(f'{family}_bucket{{model="{model}",le="{bound}"}} {count}')
                lines.append(f'{family}_sum{{model="{model}"}} {row[total]}')
                lines.append(f'{family}_count{{model="{model}"}} {row[_CALLS]}')
        classes = totals[len(self.models) :]
        lines += [
            "# HELP bert_api_requests_total API requests by priority class and outcome",
            "# TYPE bert_api_requests_total counter",
        ]
        for name, row in zip(PRIORITY_CLASSES, classes, strict=True):
            lines += [
                f'bert_api_requests_total{{class="{name}",outcome="{o}"}} {row[i]}' for i, o in enumerate(OUTCOMES)
            ]
        lines += [
            "# HELP bert_api_queue_seconds_total Time served requests queued in the API front, by priority class",
            "# TYPE bert_api_queue_seconds_total counter",
        ]
        lines += [
            f'bert_api_queue_seconds_total{{class="{n}"}} {row[_QUEUED_US] / 1e6:.6f}'
            for n, row in zip(PRIORITY_CLASSES, classes, strict=True)
        ]
        return "\n".join(lines) + "\n"
