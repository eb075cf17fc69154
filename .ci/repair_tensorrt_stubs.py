"""Copy the tensorrt-stubs package's stubs where mypy reads them, repaired (CI type-checks the TensorRT builder).

tensorrt-stubs installs `tensorrt/` and `tensorrt_bindings/` without a py.typed marker, so mypy skips them, and
its generated signatures are not all valid Python: parameters named `in`, and parameters without a default
after ones with a default. Usage: python .ci/repair_tensorrt_stubs.py OUT_DIR (then MYPYPATH=OUT_DIR mypy ...).
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path

DEF = re.compile(r"^(\s*def \w+\()(.*)(\)\s*->.*)$")


def split_params(params: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in params:
        depth += 1 if char in "[(" else -1 if char in "])" else 0
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current.strip() else parts


def repair(line: str) -> str:
    match = DEF.match(line)
    if not match:
        return line
    head, params, tail = match.groups()
    fixed, defaulted = [], False
    for param in split_params(params):
        name = param.strip().split(":")[0].split("=")[0].strip()
        if keyword.iskeyword(name):
            param = param.replace(name, name + "_", 1)
        if "=" in param:
            defaulted = True
        elif defaulted and not name.startswith("*"):
            param += " = ..."
        fixed.append(param)
    return head + ",".join(fixed) + tail


def main(out: Path) -> None:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or spec.origin is None:
        sys.exit("tensorrt-stubs is not installed: pip install --no-deps tensorrt-stubs")
    site = Path(spec.origin).parent.parent
    for package in ("tensorrt", "tensorrt_bindings"):
        for stub in (site / package).glob("*.pyi"):
            target = out / package / stub.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(map(repair, stub.read_text().splitlines())) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
