"""bench.api_cost's request bodies: what each HTTP route posts, the same from either load generator; and the bytes
per text it records, counted off the wire."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from bench.api_cost import (
    COHERE_TYPES,
    DEFAULT_ROUTES,
    QUANTIZED_FORMATS,
    ROUTES,
    _api_loop,
    addresses,
    perf_analyzer_data,
    request_body,
    summary,
)
from serving.launcher.triton_command import Ports


def test_each_http_route_posts_its_api_body_to_its_path():
    where = addresses(Ports(8000, 8001, 8002, api=8080))
    assert set(where) == set(ROUTES) - {"api-base64-alone"}  # the second front's port is the bench's own
    for route, encoding in (("api-base64", "base64"), ("api-float", "float"), ("api-base64-alone", "base64")):
        assert request_body(route, "m", "a text") == {"model": "m", "input": "a text", "encoding_format": encoding}
    assert where["api-float"] == "http://127.0.0.1:8080/v1/embeddings"
    assert where["tei-embed"] == "http://127.0.0.1:8080/embed"
    assert request_body("tei-embed", "m", "a text") == {"inputs": "a text"}


def test_the_quantized_routes_ask_openai_and_cohere_for_their_precision_and_are_not_run_unless_named():
    where = addresses(Ports(8000, 8001, 8002, api=8080))
    for name in QUANTIZED_FORMATS:
        assert where[f"api-{name}"] == "http://127.0.0.1:8080/v1/embeddings"
        assert request_body(f"api-{name}", "m", "a text") == {"model": "m", "input": "a text", "encoding_format": name}
    for name in COHERE_TYPES:
        assert where[f"cohere-{name}"] == "http://127.0.0.1:8080/v2/embed"
        assert request_body(f"cohere-{name}", "m", "a text") == {
            "model": "m", "texts": ["a text"], "input_type": "search_document", "embedding_types": [name],
        }  # fmt: skip
    named = {"api-int8", "api-uint8", "api-binary", "api-ubinary", "cohere-float", "cohere-int8", "cohere-binary"}
    assert named <= set(ROUTES)
    assert not named & set(DEFAULT_ROUTES)  # like tei-embed: they would lengthen the default run


def test_perf_analyzer_posts_one_text_per_request_in_the_corpus_order():
    texts = ["first text", 'second, with "quotes"', "third ünïcode"]
    data = json.loads(json.dumps(perf_analyzer_data("api-float", "m", texts)))  # as the file perf_analyzer reads
    assert data == {"data": [{"payload": [request_body("api-float", "m", text)]} for text in texts]}
    cohere = perf_analyzer_data("cohere-binary", "m", texts)["data"][2]["payload"][0]
    assert cohere["texts"] == ["third ünïcode"] and cohere["embedding_types"] == ["binary"]


def test_the_http_loop_counts_every_answer_body_as_received_not_as_parsed_and_sends_the_extra_headers():
    answers = {b'{"a": 1}': b'{"data": [{"embedding": [1, -2, 3]}]}', b'{"a": 2}': b'{"data": [{"embedding": "AAAA"}]}'}
    posted: list[bytes] = []
    budgets: set[str | None] = set()

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        posted.append(body)
        budgets.add(request.headers.get("X-Request-Timeout"))
        return web.Response(body=answers[body], content_type="application/json")

    async def drive() -> tuple[list[float], int]:
        app = web.Application()
        app.router.add_post("/v1/embeddings", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            url = f"http://127.0.0.1:{port}/v1/embeddings"
            return await _api_loop(url, list(answers), 2, time.perf_counter() + 0.3, {"X-Request-Timeout": "1s"})
        finally:
            await runner.cleanup()

    latencies, received = asyncio.run(drive())
    assert len(latencies) == len(posted) > 2
    assert received == sum(len(answers[body]) for body in posted)
    assert budgets == {"1s"}  # --header: on every request


def test_the_summary_puts_bytes_per_text_beside_req_s_and_each_route_against_float():
    def run(rps: float, size: float | None) -> dict:
        return {"rps": rps} if size is None else {"rps": rps, "bytes_per_text": size}

    runs = {
        "api-float": [run(50, 4800), run(52, 4810), run(40, 4790)],
        "api-binary": [run(60, 320), run(55, 330), run(65, 325)],
    }
    found = summary(runs)
    assert found["median_rps"] == {"api-float": 50, "api-binary": 60}
    assert found["bytes_per_text"] == {"api-float": 4800.0, "api-binary": 325.0}
    assert found["vs_float"]["api-binary"] == {"rps": 1.2, "bytes": round(325 / 4800, 3)}
    assert found["vs_grpc"] == {}  # grpc did not run
    # perf_analyzer does not count the bytes: none recorded, no ratio made up
    found = summary({"api-float": [run(50, None)], "api-int8": [run(40, None)]})
    assert found["bytes_per_text"] == {"api-float": None, "api-int8": None}
    assert found["vs_float"]["api-int8"] == {"rps": 0.8, "bytes": None}
