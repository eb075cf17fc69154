"""The HTTP front's check of an inference body that Triton refused: what it names as the problem."""

from __future__ import annotations

import pytest

from serving.http_front.proxy import infer_request_problem


@pytest.mark.parametrize(
    ("body", "header", "problem"),
    [
        (b'{"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}', None, None),
        (b'{"inputs": [{"name": "t", "shape": [2], "datatype": "FP32", "data": [[1.5], [2]]}]}', None, None),
        (
            b'{"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [true]}]}',
            None,
            "not of datatype FP32",
        ),
        (b'{"inputs": [{"name": "t", "shape": [1], "datatype": "BOOL", "data": [1]}]}', None, "not of datatype BOOL"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "data": ["x"]}]}', None, "inputs[0].shape must be a list"),
        (b'{"inputs": ["t"]}', None, "inputs[0] must be an object"),
        (b"[1, 2]", None, "JSON object with a non-empty list 'inputs'"),
        (b"\xff\xfe", None, "not JSON"),
        (b'{"inputs": [{"name": "t", "shape": [1], "datatype": "FP32"}]}\0\0\0\0', "61", None),
        (b'{"inputs": []}', "99", "byte length of the JSON header"),
    ],
)
def test_infer_request_problem(body, header, problem):
    found = infer_request_problem(body, header)
    assert found == problem if problem is None else problem in found
