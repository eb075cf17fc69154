"""One execute() of each tokenizing stage, run in this process with Triton's Python API stood in for: a refused
request between good ones fails alone."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from tests.support import over_limit_texts


class Backend:
    """What the stages use of triton_python_backend_utils, without Triton: requests in, responses out, and
    metrics that cannot be created (so they turn off, as the stages allow)."""

    class TritonError:
        INVALID_ARG = 3

        def __init__(self, message: str, code: int) -> None:
            self.message, self.code = message, code

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None) -> None:
            self.outputs = {tensor.name: tensor.array for tensor in output_tensors or []}
            self.error = error

    class MetricFamily:
        COUNTER = 0

        def __init__(self, **_) -> None:
            raise RuntimeError("no metrics outside Triton")

    Logger = types.SimpleNamespace(log_warn=lambda message: None, log_info=lambda message: None)

    @staticmethod
    def get_input_tensor_by_name(request: dict, name: str):
        return types.SimpleNamespace(as_numpy=lambda: request[name])


class Request(dict):
    """A request as the stages read it: its texts (str or UTF-8 bytes), its KServe parameters (JSON) and the outputs
    it names (none: Triton then asks for every output, which a hybrid model's stage reads as all)."""

    def __init__(self, texts: list, parameters: dict | None = None, asked: tuple[str, ...] = ()) -> None:
        rows = [[text if isinstance(text, bytes) else text.encode()] for text in texts]
        super().__init__(text=np.array(rows, dtype=np.object_))
        self._parameters, self.asked = json.dumps(parameters or {}), list(asked)

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self.asked


def loaded_stage(monkeypatch, settings, export_dir: Path, folder: Path, stage: str):
    """The stage module's TritonPythonModel, initialized as Triton would on the repository generated from
    settings and export_dir into folder, with Backend standing in for Triton's Python API."""
    # Imported here: the GPU machine's Python, which runs the GPU tests of modules importing this one, has no
    # tritonclient.
    from tritonclient.grpc import model_config_pb2 as mc

    from model_repository.generate import generate

    model = "tokenizer" if stage == "tokenizer_model" else "ensemble"
    model_dir = generate(settings, export_dir, folder) / model
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    args = {
        "model_config": json.dumps(
            json_format.MessageToDict(
                config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        ),
        "model_repository": str(model_dir),
        "model_version": "1",
        "model_name": model,
        "model_instance_name": f"{model}_0_0",
        "model_instance_kind": "CPU",
    }
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", Backend)
    module = importlib.import_module(f"model_repository.stages.{stage}")
    monkeypatch.setattr(module, "pb_utils", Backend)
    instance = module.TritonPythonModel()
    instance.initialize(args)
    return instance


def assert_served_as_alone(together: list, alone: list, atol: float = 0.0) -> None:
    """Each response of one execute() is what its request gets in an execute() of its own: the same bits, or within
    atol (the torch engine's GEMMs round by the batch's shape)."""
    for shared, single in zip(together, alone, strict=True):
        assert shared.error is None and shared.outputs.keys() == single.outputs.keys()
        for name, array in shared.outputs.items():
            if atol and array.dtype.kind == "f":
                np.testing.assert_allclose(array, single.outputs[name], atol=atol, rtol=0)
            else:
                np.testing.assert_array_equal(array, single.outputs[name])


@pytest.mark.parametrize("stage", ["pipeline_model", "tokenizer_model"])
def test_a_refused_request_in_an_execute_fails_alone(monkeypatch, settings, exported, tmp_path, stage):
    """One execute() of the stage that tokenizes, given a refused request between good ones: it fails with
    INVALID_ARG, the others get what they would get alone."""
    topology = "one_stage" if stage == "pipeline_model" else "two_stage"
    chosen = dataclasses.replace(settings, ensemble=dataclasses.replace(settings.ensemble, topology=topology))
    instance = loaded_stage(monkeypatch, chosen, exported, tmp_path / "repo", stage)
    huge = over_limit_texts(settings.tokenizer.max_text_bytes)["one-byte-over"]
    requests = [Request([text]) for text in (b"first good text", huge, b"a second one")]
    together = instance.execute(requests)
    alone = [instance.execute([request])[0] for request in requests]
    instance.finalize()
    assert together[1].error.code == Backend.TritonError.INVALID_ARG
    assert "tokenizer.max_text_bytes" in together[1].error.message and not together[1].outputs
    assert_served_as_alone(together[::2], alone[::2])
