"""bench.plot reads every benchmark JSON the repository records: a plot, or a line naming what it skipped."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench import plot

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_every_recorded_result_plots_or_is_named(tmp_path, capsys):
    copies = []
    for index, result in enumerate(sorted(RESULTS.rglob("*.json"))):
        copies.append(tmp_path / f"{index}-{result.name}")
        shutil.copy(result, copies[-1])
    assert copies
    plot.main([str(path) for path in copies])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(copies)
    for path, line in zip(copies, printed, strict=True):
        assert line == f"wrote {path.with_suffix('.png')}" or line.startswith(f"{path}: no plot for benchmark")
        assert path.with_suffix(".png").exists() == line.startswith("wrote")
