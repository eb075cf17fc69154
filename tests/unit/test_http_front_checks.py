"""The HTTP front's handling of inference bodies: what it names as the problem of one that Triton refused, and
the request id it puts into one without an id of its own."""

from __future__ import annotations

import pytest

from serving.http_front.proxy import infer_request_problem, with_request_id


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


@pytest.mark.parametrize(
    ("body", "header", "sent", "sent_header"),
    [
        (b' {"inputs": []}', None, b' {"id":"r-1","inputs": []}', None),
        (b'{"id": "mine", "inputs": []}', None, b'{"id": "mine", "inputs": []}', None),
        (  # "id" further in is not the caller's request id
            b'{"inputs": [{"data": ["\\"id\\""], "parameters": {"id": 3}}]}',
            None,
            b'{"id":"r-1","inputs": [{"data": ["\\"id\\""], "parameters": {"id": 3}}]}',
            None,
        ),
        (b'{"inputs": []}\x05\x00\x00\x00"id"!', "14", b'{"id":"r-1","inputs": []}\x05\x00\x00\x00"id"!', "25"),
        (b'{"id": "mine"}\x00', "14", b'{"id": "mine"}\x00', "14"),
        (b'{"inputs": []}', "99", b'{"inputs": []}', "99"),
        (b"{}", None, b"{}", None),
        (b"not json", None, b"not json", None),
        (b'{"id" broken', None, b'{"id" broken', None),
    ],
)
def test_the_request_id_goes_into_an_inference_body_without_one(body, header, sent, sent_header):
    assert with_request_id(body, header, "r-1") == (sent, sent_header)
