"""The README's and docs' commands and paths are real: every `make` target exists, every `python -m` module
imports from this tree and takes the flags the text gives it, every `bash` script, file path and relative
link names something in the repository. Read statically, so it runs in a second."""

from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md"))]


DOCS += sorted((ROOT / "helm").glob("*/README.md"))
TOP = {path.name for path in ROOT.iterdir()} - {".git", ".venv", "build"}


# A command in a fenced block or in backticks, from its program to the end of the span.
COMMAND = re.compile(r"(?:^|[`\s(])((?:\S*/)?(?:python3?|make|bash) [^`\n]*)")


# A path in backticks: a top-level folder of the repository, then more of it.
PATH = re.compile(r"`((?:[\w.-]+/)+[\w.*<>-]*)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


# A file named in backticks by its name or the end of its path (`stages/text_input.py`, `health.py`).
FILE = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|toml|sh|md|json|yaml|tpl|txt))`")
SKIPPED = {".git", ".venv", "build", "node_modules", "__pycache__", ".kit", ".hypothesis", ".pytest_cache"}


# Files the project writes (exports, generated repositories, results), named in the docs without existing here;
# config_sentence_transformers.json is a checkpoint's, which the export copies.
WRITTEN = {
    "serving.json",
    "tokenizer.json",
    "config.json",
    "config_sentence_transformers.json",
    "model.py",
    "settings.toml",
    "loadtest.json",
    "build.txt",  # make image's report
    "results.json",  # make image-test's figures
}


def repository_files() -> list[str]:
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not d.endswith(".egg-info")]
        found += [f"{folder.removeprefix(str(ROOT))}/{name}" for name in names]
    return found


def spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            found.append(line.split("  # ")[0].strip())
        else:
            found += re.findall(r"`([^`]+)`", line)
    return found


def commands(text: str) -> list[list[str]]:
    found = []
    for span in spans(text):
        for match in COMMAND.finditer(span):
            words = match.group(1).replace("\\", " ").split("|")[0].split("&&")[0].split(";")[0]
            try:
                found.append(shlex.split(words))
            except ValueError:  # an unbalanced quote of a snippet cut short
                found.append(words.split())
    return found


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def flag_patterns(module: str) -> list[re.Pattern]:
    """The --flags a module's argument parsers accept, from its source (and its package's, for a package, and
    the modules of its own top package it imports, which may add shared flags): an f-string flag such as
    f"--{name}-port" becomes a pattern."""
    path = ROOT / Path(*module.split("."))
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    top = module.split(".")[0]
    for file in list(files):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{top}."):
                imported = (ROOT / Path(*node.module.split("."))).with_suffix(".py")
                if imported.is_file() and imported not in files:
                    files.append(imported)
    patterns = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
                patterns.append(re.compile(re.escape(node.value) + "$"))
            elif isinstance(node, ast.JoinedStr) and node.values:
                first = node.values[0]
                if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                    parts = [re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z-]+" for v in node.values]
                    patterns.append(re.compile("".join(parts) + "$"))
    return patterns


def module_exists(module: str) -> bool:
    path = ROOT / Path(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def module_runs(module: str) -> bool:
    """Whether `python -m module` does something: a package's __main__.py, or a module with a main guard (one
    without it imports and exits 0, silently)."""
    path = ROOT / Path(*module.split("."))
    return (path / "__main__.py").is_file() or '__name__ == "__main__"' in path.with_suffix(".py").read_text()


def problems(doc: Path) -> list[str]:
    text, found = doc.read_text(), []
    targets = make_targets()
    for words in commands(text):
        program = Path(words[0]).name
        if program == "make":
            named = [word for word in words[1:] if re.fullmatch(r"[a-z][\w-]*", word)]
            found += [f"make {word}: no such target" for word in named if word not in targets]
        elif program.startswith("python") and len(words) > 2 and words[1] == "-m":
            module = words[2]
            if module.split(".")[0] not in TOP:
                continue  # another program's module (pytest, pip)
            if not module_exists(module):
                found.append(f"python -m {module}: no such module")
                continue
            if not module_runs(module):
                found.append(f'python -m {module}: no `if __name__ == "__main__"`: it would run nothing')
            patterns = flag_patterns(module)
            for word in words[3:]:
                flag = word.split("=")[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and not any(p.match(flag) for p in patterns):
                    found.append(f"python -m {module}: no flag {flag}")
        elif program.startswith("python") and len(words) > 1 and words[1].endswith(".py"):
            if not (ROOT / words[1]).is_file():
                found.append(f"{words[1]}: no such script")
        elif program == "bash" and len(words) > 1 and words[1].endswith(".sh") and not (ROOT / words[1]).is_file():
            found.append(f"bash {words[1]}: no such script")
    for path in PATH.findall(text):
        if path.split("/")[0] in TOP and not any(c in path for c in "*<>") and not (ROOT / path).exists():
            found.append(f"`{path}` does not exist")
    files = repository_files()
    for name in FILE.findall(text):
        if name.split("/")[-1] not in WRITTEN and not any(path.endswith("/" + name) for path in files):
            found.append(f"`{name}`: no such file")
    for link in LINK.findall(text):
        if "://" not in link and not (doc.parent / link).exists():
            found.append(f"link {link} does not exist")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_command_and_path_in_the_docs_is_real(doc):
    assert not problems(doc), "\n".join(problems(doc))


def test_the_checker_catches_a_stale_command_flag_path_and_link(tmp_path):
    doc = tmp_path / "stale.md"
    doc.write_text(
        "Run `make no-such-target`, `python -m serving.nowhere`, `python -m serving.launcher --no-such-flag 1`,\n"
        "read `serving/launcher/gone.py`, `gone_too.py` and [this](missing.md); `make serve`, `watchdog.py` and "
        "`python -m serving.launcher --http-port 1` are fine.\n"
    )
    assert problems(doc) == [
        "make no-such-target: no such target",
        "python -m serving.nowhere: no such module",
        "python -m serving.launcher: no flag --no-such-flag",
        "`serving/launcher/gone.py` does not exist",
        "`serving/launcher/gone.py`: no such file",
        "`gone_too.py`: no such file",
        "link missing.md does not exist",
    ]
