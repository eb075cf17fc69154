"""The house's floors: every module imports downwards only, no modules import each other in a circle, and
what every model version copies is self-contained. The README's "Layers" line says the same as LAYERS."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "settings", "protocol", "model_repository", "export", "client", "serving", "loadtest", "bench")


# (module prefix, layer), the longest prefix first; RANKS orders the layers bottom up. A module may import its
# own layer or one of a lower rank; two layers of one rank never import each other.
LAYERS = (
    ("model_repository.stages.engines", "engines"),
    ("model_repository.stages", "stages"),
    ("model_repository", "model_repository"),
    ("serving.launcher", "launcher"),
    ("serving.http_front", "http_front"),
    ("serving.api", "api"),
    ("serving", "serving"),
    *((name, name) for name in ("common", "settings", "protocol", "export", "client", "loadtest", "bench")),
)
RANKS = {
    "common": 0,
    "settings": 1,
    "protocol": 1,
    "engines": 1,
    "stages": 2,
    "export": 2,
    "client": 2,
    "model_repository": 3,
    "serving": 3,
    "http_front": 4,
    "api": 4,
    "launcher": 5,
    "loadtest": 6,
    "bench": 7,
}


def layer(module: str) -> str | None:
    for prefix, name in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def imports(module: str, path: Path) -> set[str]:
    """Every module this one imports, anywhere in it (inside functions and TYPE_CHECKING blocks too), with
    relative imports resolved; `from package import name` counts as importing package.name too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = project_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {target for name in imports(module, path) if (target := resolve(name)) and target != module}
        for module, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_imports_run_downwards_only():
    graph, upward = import_graph(), []
    for module, targets in sorted(graph.items()):
        source = layer(module)
        assert source, f"{module} belongs to no layer: add it to LAYERS"
        for target in sorted(targets):
            other = layer(target)
            if other != source and RANKS[other] >= RANKS[source]:
                upward.append(f"{module} ({source}, {RANKS[source]}) imports {target} ({other}, {RANKS[other]})")
    assert {layer(module) for module in graph} == set(RANKS)
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    found = circles(import_graph())
    assert not found, "\n".join(" <-> ".join(circle) for circle in found)


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_what_every_model_version_copies_holds_only_what_the_stages_import():
    """common/ and the stages package go into every Python model's version folder, where nothing else of this
    project exists: they import only themselves, and every module of common/ is imported by some stage."""
    graph = import_graph()
    copied = {module for module in graph if layer(module) in ("common", "stages", "engines")}
    for module in sorted(copied):
        outside = {target for target in graph[module] if target not in copied}
        assert not outside, f"{module} imports {outside}, which no model version holds"
    used = set()
    for module in copied - {m for m in copied if layer(m) == "common"}:
        used |= graph[module]
    unused = {m for m in copied if layer(m) == "common" and m != "common"} - used
    assert not unused, f"common/ holds modules no stage imports: {sorted(unused)}"


def test_every_engine_kind_is_a_registered_engine_triton_s_tensorrt_backend_or_auto():
    from model_repository.stages.engines import ENGINES
    from settings.schema import ENGINE_KINDS

    assert set(ENGINE_KINDS) == {*ENGINES, "tensorrt", "auto"}


def test_the_readme_names_the_layers_as_this_test_ranks_them():
    """README.md has one line `Layers, bottom up: a < b, c < ...`: the same layers in the same ranks."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("Layers, bottom up:"))
    floors = [re.findall(r"`([a-z_]+)`", floor) for floor in line.removeprefix("Layers, bottom up:").split("<")]
    by_rank: dict[int, set[str]] = {}
    for name, rank in RANKS.items():
        by_rank.setdefault(rank, set()).add(name)
    assert [set(floor) for floor in floors] == [by_rank[rank] for rank in sorted(by_rank)]


def test_the_device_benchmarks_import_without_tritonclient():
    """The device image's Python has torch and transformers but no tritonclient: what its benchmarks import (the
    readers of packed outputs among them) must not need it."""
    blocked = "import sys; sys.modules['tritonclient'] = None; "
    modules = ["protocol.packed", "protocol.multi_vector", "protocol.sparse", "bench.multi_vector_bench",
               "bench.hybrid_bench", "bench.engine_bench"]  # fmt: skip
    for module in modules:
        result = subprocess.run([sys.executable, "-c", blocked + f"import {module}"], cwd=ROOT, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, f"{module} needs tritonclient:\n{result.stderr[-800:]}"
