"""A TensorRT plan served through the NGC tritonserver (skipped here, saying why: no TensorRT, no GPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from export.tensorrt import prepare
from model_repository.generate import generate
from tests.support import needs_tensorrt


@needs_tensorrt
@pytest.mark.skipif(not Path("/opt/tritonserver/bin/tritonserver").is_file(), reason="needs an NGC tritonserver")
def test_plan_serves_through_triton(trt_settings, sentences, tmp_path, reference_model):
    from client import TextClient
    from serving.launcher.harness import local_server

    spec_path, _ = prepare(trt_settings)
    from export.tensorrt_build import build

    build(json.loads(spec_path.read_text()))
    root = generate(trt_settings, out=tmp_path / "repo")
    os.environ.setdefault("TRITONSERVER_BIN", "/opt/tritonserver/bin/tritonserver")
    os.environ.setdefault("TRITON_BACKENDS_DIR", "/opt/tritonserver/backends")
    server = local_server(trt_settings, root, tmp_path / "server").start()
    try:
        with TextClient(server.grpc_url, "grpc") as client:
            served = np.concatenate([client.embed([text]) for text in sentences])
    finally:
        server.stop()
    reference = reference_model.encode(sentences)
    cosine = (served * reference).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.999
