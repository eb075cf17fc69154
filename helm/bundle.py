"""The bundle the Helm chart serves from a claim: `python helm/bundle.py --settings FILE --out DIR`.

    DIR/settings.toml       the settings file (the chart needs it too: --set-file settings.toml=DIR/settings.toml)
    DIR/model-N.toml        with several settings files: each later model's (the chart's extraModels[N-1].toml)
    DIR/repository/         the Triton model repository generated from it (python -m model_repository.generate)
    DIR/engine/             engine.kind tensorrt only: the build spec and the ONNX model it names

For engine.kind = "tensorrt" the repository holds no plan: the chart's engine build (docker/engine_cache.py
in the builder image) makes it on the serving GPU type, caches it per GPU product and places it in
repository/encoder/1/. A plan built elsewhere would be refused by the launcher on another GPU.

Run `make export SETTINGS=FILE` first. Then copy DIR to the claim (modelRepository.source = pvc), or
DIR/repository to the object store (modelRepository.source = objectStore; no engine build there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from model_repository.configs import ENGINE_FILES
from model_repository.generate import generate
from settings import ROOT, Deployment, Settings, SettingsError, load_deployment
from settings.deployment import SERVER_WIDE

ENGINE_DIR = "engine"
SPEC_FILE = "tensorrt_build.json"  # what docker/engine_cache.py reads


def write_repository(settings: Settings, export_dir: Path, out: Path) -> Path:
    """The generated repository in out; for tensorrt, without the plan (the engine build adds it)."""
    if settings.engine.kind != "tensorrt":
        return generate(settings, export_dir, out)
    with tempfile.TemporaryDirectory() as scratch:
        # generate() copies the plan files from the export folder: give it the export with placeholders.
        staged = Path(scratch)
        for path in export_dir.iterdir():
            if path.is_file():
                os.symlink(path.resolve(), staged / path.name)
        for name in ENGINE_FILES["tensorrt"]:
            (staged / name).unlink(missing_ok=True)
            (staged / name).write_bytes(b"")
        repository = generate(settings, staged, out)
    for name in ENGINE_FILES["tensorrt"]:
        (repository / "encoder" / "1" / name).unlink()
    return repository


def write_engine_inputs(settings: Settings, out: Path) -> Path:
    """out/engine/: the TensorRT build spec and its ONNX model (python -m export.tensorrt's preparation)."""
    from export.tensorrt import prepare

    spec_path, report = prepare(settings)
    print(json.dumps(report, indent=2), flush=True)
    spec = json.loads(spec_path.read_text())
    engine = out / ENGINE_DIR
    if engine.exists():
        shutil.rmtree(engine)
    engine.mkdir(parents=True)
    onnx = ROOT / spec["onnx"]  # spec paths are relative to the repository root (or absolute)
    shutil.copyfile(onnx, engine / onnx.name)
    shutil.copyfile(spec_path, engine / SPEC_FILE)
    return engine


def write_bundle(settings: Settings | Deployment, out: Path) -> Path:
    """The bundle of one model, or of several served together: settings.toml (the first, complete) and
    model-N.toml for each other model (without the server-wide sections, as the chart's extraModels take them)."""
    deployment = Deployment.of(settings)
    tensorrt = [model for model in deployment.models if model.engine.kind == "tensorrt"]
    if tensorrt and (len(deployment.models) > 1):
        raise SettingsError("a TensorRT model is bundled alone: the engine build makes one model's plan")
    out.mkdir(parents=True, exist_ok=True)
    if tensorrt:
        write_engine_inputs(deployment.first, out)
        write_repository(deployment.first, deployment.first.export_dir, out / "repository")
    else:
        generate(deployment, out=out / "repository")
    (out / "settings.toml").write_text(deployment.first.as_toml())  # complete: the chart has no defaults of its own
    for index, model in enumerate(deployment.models[1:], start=1):
        (out / f"model-{index}.toml").write_text(model.as_toml(SERVER_WIDE))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python helm/bundle.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", nargs="+", default=[], help="settings file(s), one per model (default: settings/defaults.toml)"
    )
    parser.add_argument("--out", type=Path, default=Path("build/bundle"), help="bundle folder (default: build/bundle)")
    args = parser.parse_args(argv)
    try:
        deployment = load_deployment(args.settings)
        out = write_bundle(deployment, args.out)
    except (SettingsError, RuntimeError) as exc:
        print(f"bundle failed: {exc}", file=sys.stderr)
        return 1
    files = [f"settings.toml={out}/settings.toml"]
    files += [f"extraModels[{i - 1}].toml={out}/model-{i}.toml" for i in range(1, len(deployment.models))]
    flags = " ".join(f"--set-file {file}" for file in files)
    print(f"bundle in {out}: copy it to the chart's claim; helm install {flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
