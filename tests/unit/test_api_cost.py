"""bench.api_cost's request bodies: what each HTTP route posts, the same from either load generator."""

from __future__ import annotations

import json

from bench.api_cost import ROUTES, addresses, perf_analyzer_data, request_body
from serving.launcher.triton_command import Ports


def test_each_http_route_posts_its_api_body_to_its_path():
    where = addresses(Ports(8000, 8001, 8002, api=8080))
    assert set(where) == set(ROUTES) - {"api-base64-alone"}  # the second front's port is the bench's own
    for route, encoding in (("api-base64", "base64"), ("api-float", "float"), ("api-base64-alone", "base64")):
        assert request_body(route, "m", "a text") == {"model": "m", "input": "a text", "encoding_format": encoding}
    assert where["api-float"] == "http://127.0.0.1:8080/v1/embeddings"
    assert where["tei-embed"] == "http://127.0.0.1:8080/embed"
    assert request_body("tei-embed", "m", "a text") == {"inputs": "a text"}


def test_perf_analyzer_posts_one_text_per_request_in_the_corpus_order():
    texts = ["first text", 'second, with "quotes"', "third ünïcode"]
    data = json.loads(json.dumps(perf_analyzer_data("api-float", "m", texts)))  # as the file perf_analyzer reads
    assert data == {"data": [{"payload": [request_body("api-float", "m", text)]} for text in texts]}
