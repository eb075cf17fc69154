"""Checkpoints made in a test, exported and served by one real launcher: a settings file per model (its engine in
fp32, the build folder in the test's own), the first with one API worker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from export.__main__ import export
from model_repository.generate import generate
from serving.launcher.harness import Launcher
from serving.launcher.triton_command import Ports
from settings import load_deployment


@dataclass(frozen=True)
class Model:
    checkpoint: Path
    name: str
    task: str
    max_tokens: int
    engine: str = "onnxruntime_cpu"
    sections: str = ""  # more TOML sections of its settings file, e.g. "[ensemble]\nmax_batch_size = 4\n"


@contextlib.contextmanager
def served(models: list[Model], settings, work: Path) -> Iterator[Launcher]:
    """The started launcher of the models; stopped when the block ends."""
    files = []
    for index, model in enumerate(models):
        export(str(model.checkpoint), model.task, model.max_tokens, work / "models" / model.name,
               settings.engine.onnx_opset, settings.engine.onnx_tolerance, onnx=model.engine != "torch")  # fmt: skip
        path = work / f"{model.name}.toml"
        path.write_text(
            f'[model]\nsource = "{model.checkpoint}"\nname = "{model.name}"\ntask = "{model.task}"\n'
            f'max_tokens = {model.max_tokens}\n\n[engine]\nkind = "{model.engine}"\nprecision = "fp32"\n\n'
            f'{model.sections}\n[server]\nbuild_dir = "{work}"\n' + ("\n[api]\nworkers = 1\n" if index == 0 else "")
        )
        files.append(path)
    started = Launcher(files, generate(load_deployment(files)), Ports.free(), work / "launcher.log").start()
    try:
        yield started
    finally:
        started.terminate()
        started.process.wait(timeout=60)
