"""Copy settings files into the chart's values: `python helm/sync_settings.py [--check]`.

The chart reads the deployment's shape (ports, GPUs per pod, Python-backend instances, engine kind) from
the settings file embedded as `settings.toml` in its values. Every values file here that names its source
(`settings.source`, a repository path) gets that file's text as `settings.toml`, so the chart's defaults and
overlays always describe the settings the model repository was generated from.

--check changes nothing and exits 1 when an embedded copy differs from its source (tests/test_helm.py runs
the same check). The copies are compared as parsed TOML, so comments and formatting do not count, and
without [loadtest]: that section sets the bar of `python -m loadtest` and nothing in the deployment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "bert-triton"
VALUES_FILES = (CHART / "values.yaml", *sorted((ROOT / "helm" / "values").glob("*.yaml")))
INDENT = "    "
NOT_DEPLOYED = ("loadtest",)  # settings sections the chart and the server never read


def embedded(values_file: Path) -> tuple[str | None, str | None]:
    """(settings.source, settings.toml) of a values file; None where it has none."""
    settings = (yaml.safe_load(values_file.read_text()) or {}).get("settings") or {}
    return settings.get("source"), settings.get("toml")


def stale(values_file: Path) -> str | None:
    """Why the embedded settings differ from their source, or None when they agree (or there is no source)."""
    source, text = embedded(values_file)
    if source is None:
        return None
    path = ROOT / source
    if not path.is_file():
        return f"{values_file.relative_to(ROOT)}: settings.source {source} does not exist"
    if text is None or _deployed(tomllib.loads(text)) != _deployed(tomllib.loads(path.read_text())):
        return f"{values_file.relative_to(ROOT)}: settings.toml differs from {source}"
    return None


def _deployed(settings: dict) -> dict:
    return {section: values for section, values in settings.items() if section not in NOT_DEPLOYED}


def with_settings(values_text: str, settings_text: str) -> str:
    """values_text with the block scalar under `settings:` / `  toml: |` replaced by settings_text."""
    lines = values_text.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if line.rstrip() == "  toml: |" and _in_settings(lines, i)),
        None,
    )
    if start is None:
        raise ValueError("no `  toml: |` block under `settings:`")
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(INDENT)):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines after the block stay outside it
        end -= 1
    block = [INDENT + line if line.strip() else "\n" for line in settings_text.rstrip("\n").splitlines(keepends=True)]
    block[-1] = block[-1].rstrip("\n") + "\n"
    return "".join(lines[: start + 1] + block + lines[end:])


def _in_settings(lines: list[str], index: int) -> bool:
    for line in reversed(lines[:index]):
        if line.strip() and not line.startswith((" ", "#")):
            return line.rstrip() == "settings:"
    return False


def sync(values_file: Path) -> bool:
    """Rewrites values_file's embedded settings from its source; True when the file changed."""
    source, _ = embedded(values_file)
    if source is None:
        return False
    text = values_file.read_text()
    updated = with_settings(text, (ROOT / source).read_text())
    if updated != text:
        values_file.write_text(updated)
    return updated != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python helm/sync_settings.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a copy is stale")
    args = parser.parse_args(argv)
    if args.check:
        problems = [problem for problem in map(stale, VALUES_FILES) if problem]
        for problem in problems:
            print(f"{problem}: run python helm/sync_settings.py", file=sys.stderr)
        return 1 if problems else 0
    for values_file in VALUES_FILES:
        if sync(values_file):
            print(f"updated {values_file.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
