"""TensorRT plans built on the GPU that serves them, cached per GPU product: `python3 docker/engine_cache.py`.

    python3 docker/engine_cache.py --bundle DIR --cache DIR [--out DIR] [--gpu-product NAME]

Runs in the engine-builder image (standard library + tensorrt; PYTHONPATH holds the project's `export`
package), as the Helm chart's init container or engine-build Job. The bundle (written by `python helm/bundle.py`) holds

    repository/                  generated for engine.kind = "tensorrt", without the plan
    engine/tensorrt_build.json   the build spec of `python -m export.tensorrt`, and the ONNX model it names

A plan is built at most once per GPU product, TensorRT version and build key (ONNX digest, profiles,
precision, builder options), into CACHE/<product>/tensorrt-<version>/<build key>/ (model.plan and its
model.plan.json). Builds go to a private folder renamed into place when done, so pods sharing the cache
never see half a plan; a lock file keeps two pods from building the same plan at once where the file
system supports locks. With --out the bundle's repository is copied to OUT and the plan placed in its
encoder, ready for `python3 -m serving.launcher --repository OUT`.

The product is the node label nvidia.com/gpu.product when given (--gpu-product or GPU_PRODUCT), else the
GPU's name as nvidia-smi reports it with spaces turned into dashes, which is how GPU feature discovery
writes that label ("NVIDIA H200" -> "NVIDIA-H200").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from export import sha256
from export.tensorrt_build import gpu_identity, plan_problems

SPEC_FILE = "tensorrt_build.json"
PLAN_FILES = ("model.plan", "model.plan.json")


class EngineCacheError(RuntimeError):
    """The bundle or the cache cannot give a plan for this GPU."""


def product_label(gpu_name: str) -> str:
    """A GPU name as a path-safe product label in the style of nvidia.com/gpu.product."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", gpu_name.strip()).strip("-.")
    if not label:
        raise EngineCacheError(f"cannot make a product label of GPU name {gpu_name!r}")
    return label


def plan_dir(cache: Path, product: str, tensorrt_version: str, build_key: str) -> Path:
    return cache / product_label(product) / f"tensorrt-{tensorrt_version}" / build_key


def cached_plan_problems(folder: Path, build_key: str, gpu: dict, tensorrt_version: str) -> list[str]:
    """Why the plan in folder cannot serve on this GPU and TensorRT; empty when it can."""
    sidecar_path = folder / "model.plan.json"
    if not (folder / "model.plan").is_file() or not sidecar_path.is_file():
        return [f"no plan in {folder}"]
    sidecar = json.loads(sidecar_path.read_text())
    if sidecar.get("build_key") != build_key:
        return [f"{folder} holds build {sidecar.get('build_key')}, not {build_key}"]
    return plan_problems(sidecar, gpu, tensorrt_version)


@contextlib.contextmanager
def build_lock(path: Path):
    """An exclusive lock on path where the file system supports it (best effort: builds are atomic anyway)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except (ImportError, OSError) as exc:
            print(f"[engine-cache] no lock on {path} ({exc}); building without one", flush=True)
        yield


def ensure_plan(
    spec: dict,
    engine_dir: Path,
    cache: Path,
    product: str,
    gpu: dict,
    tensorrt_version: str,
    build: Callable[[dict], dict],
) -> Path:
    """The cache folder holding a plan for this spec on this GPU, building it with `build` when missing."""
    folder = plan_dir(cache, product, tensorrt_version, spec["build_key"])
    version_dir = folder.parent
    with build_lock(version_dir / ".lock"):
        problems = cached_plan_problems(folder, spec["build_key"], gpu, tensorrt_version)
        if not problems:
            print(f"[engine-cache] cached plan for {product}: {folder}", flush=True)
            return folder
        print(f"[engine-cache] building for {product}: {problems[0]}", flush=True)
        onnx = engine_dir / Path(spec["onnx"]).name
        if not onnx.is_file():
            raise EngineCacheError(f"{onnx} is missing: the bundle must hold the ONNX model the spec names")
        if sha256(onnx) != spec["onnx_sha256"]:
            raise EngineCacheError(f"{onnx} is not the ONNX model the build spec was written for")
        scratch = folder.with_name(f"{folder.name}.building-{socket.gethostname()}-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        shared_timing = version_dir / "timing.cache"
        if shared_timing.is_file():
            shutil.copyfile(shared_timing, scratch / "timing.cache")
        local = {
            **spec,
            "onnx": str(onnx),
            "plan": str(scratch / "model.plan"),
            "timing_cache": str(scratch / "timing.cache"),
        }
        try:
            build(local)
            if (scratch / "timing.cache").is_file():
                os.replace(scratch / "timing.cache", shared_timing)
            shutil.rmtree(folder, ignore_errors=True)  # a stale plan (other GPU or a broken build)
            os.rename(scratch, folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    problems = cached_plan_problems(folder, spec["build_key"], gpu, tensorrt_version)
    if problems:
        raise EngineCacheError("the plan just built does not fit this GPU: " + "; ".join(problems))
    return folder


def assemble(repository: Path, plans: Path, out: Path) -> Path:
    """Copies the bundle's repository to out and places the plan in its TensorRT encoder."""
    config = repository / "encoder" / "config.pbtxt"
    if not config.is_file() or 'platform: "tensorrt_plan"' not in config.read_text():
        raise EngineCacheError(f"{repository} has no tensorrt_plan encoder: generate it for engine.kind tensorrt")
    shutil.copytree(repository, out, dirs_exist_ok=True)
    version = out / "encoder" / "1"
    version.mkdir(parents=True, exist_ok=True)
    for name in PLAN_FILES:
        shutil.copyfile(plans / name, version / name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine_cache.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="folder with repository/ and engine/")
    parser.add_argument("--cache", type=Path, required=True, help="plan cache shared by the pods (a PVC)")
    parser.add_argument("--out", type=Path, help="where to assemble the servable repository (omit: cache only)")
    parser.add_argument("--gpu-product", default=os.environ.get("GPU_PRODUCT", ""), help="nvidia.com/gpu.product")
    args = parser.parse_args(argv)
    try:
        import tensorrt

        from export.tensorrt_build import build

        spec = json.loads((args.bundle / "engine" / SPEC_FILE).read_text())
        gpu = gpu_identity(0)
        product = args.gpu_product or gpu["gpu_name"]
        plans = ensure_plan(spec, args.bundle / "engine", args.cache, product, gpu, tensorrt.__version__, build)
        if args.out:
            assemble(args.bundle / "repository", plans, args.out)
            print(f"[engine-cache] repository with the plan for {product_label(product)}: {args.out}", flush=True)
    except (EngineCacheError, ImportError, OSError, KeyError, ValueError) as exc:
        print(f"engine cache failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
