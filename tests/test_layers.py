"""The layers import downwards only (README, Architecture): common at the bottom, then the stages Triton runs
and export, then the model repository tooling and the client, then the load tests and the benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A module may import from a layer of a lower rank only (or its own).
RANKS = {"common": 0, "stages": 1, "export": 1, "client": 1, "tooling": 2, "loadtest": 3, "bench": 4}


def layer(module: str) -> str | None:
    top = module.split(".")[0]
    if module.startswith("model_repository.stages"):
        return "stages"
    if top == "model_repository":
        return "tooling"
    return top if top in RANKS else None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_imports_run_downwards_only():
    upward, seen = [], set()
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT)
        source = layer(".".join(relative.with_suffix("").parts))
        if source is None or relative.parts[0] in ("tests", "build"):
            continue
        seen.add(source)
        for module in imports(path):
            target = layer(module)
            if target and target != source and RANKS[target] >= RANKS[source]:
                upward.append(f"{relative} ({source}) imports {module} ({target})")
    assert seen == set(RANKS), seen
    assert not upward, "\n".join(upward)


def test_the_base_layer_and_the_stages_are_self_contained():
    """common/ imports only itself (and the stages common and each other, relatively): both are copied into
    every model version, where nothing else of this project exists."""
    for path in sorted((ROOT / "common").glob("*.py")):
        assert {layer(m) for m in imports(path)} <= {None, "common"}, path
    for path in sorted((ROOT / "model_repository" / "stages").glob("*.py")):
        assert {layer(m) for m in imports(path)} <= {None, "common"}, path
