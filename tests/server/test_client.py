"""The client library and CLI against the real server: URLs, deadlines, protocols, batches over max_batch_size,
and the asyncio client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from client import ClientError, TextClient
from client.core import AsyncTextClient
from tests.support import PROTOCOLS, url


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cli_prints_embeddings(server, protocol):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "client",
            "embed",
            "The CLI talks to Triton.",
            "Second text",
            "--url",
            url(server, protocol),
            "--protocol",
            protocol,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    embeddings = np.array(json.loads(run.stdout)["embeddings"])
    assert embeddings.shape == (2, 384)
    with TextClient(server.grpc_url, "grpc") as client:
        np.testing.assert_allclose(embeddings, client.embed(["The CLI talks to Triton.", "Second text"]), atol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_fails_fast_and_says_so_when_nothing_listens(protocol):

    started = time.monotonic()
    with (
        pytest.raises(ClientError, match=r"nothing listens at 127.0.0.1:9 \(" + protocol),
        TextClient("127.0.0.1:9", protocol) as client,
    ):
        client.embed(["nobody listens on port 9"])
    assert time.monotonic() - started < 8, "the connect budget (3 s), not the 30 s deadline"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_names_a_port_of_the_other_protocol(server, protocol):
    other = server.http_url if protocol == "grpc" else server.grpc_url
    expected = "is it Triton's HTTP port" if protocol == "grpc" else "is it Triton's gRPC port"
    with pytest.raises(ClientError, match=expected), TextClient(other, protocol) as client:
        client.embed(["wrong port"])


def test_client_takes_urls_with_a_scheme(server):
    with TextClient(f"http://{server.http_url}/") as http, TextClient(f"grpc://{server.grpc_url}") as grpc:
        assert http.protocol == "http" and grpc.protocol == "grpc"
        np.testing.assert_allclose(http.embed(["scheme"]), grpc.embed(["scheme"]), atol=1e-6)
    with pytest.raises(ValueError, match="is a http URL, but the protocol asked for is grpc"):
        TextClient(f"http://{server.http_url}", "grpc")
    with pytest.raises(ValueError, match="no TLS"):
        TextClient(f"https://{server.http_url}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_sends_more_texts_than_max_batch_size_as_several_requests(server, settings, sentences, protocol):
    limit = settings.ensemble.max_batch_size
    texts = [f"{sentences[i % len(sentences)]} ({i})" for i in range(limit + 44)]
    with TextClient(url(server, protocol), protocol) as client:
        together = client.embed(texts)
        apart = np.concatenate([client.embed(texts[:limit]), client.embed(texts[limit:])])
    assert together.shape == (limit + 44, 384)
    np.testing.assert_allclose(together, apart, atol=2e-5)


def test_cli_names_a_text_that_is_not_utf8(server):
    bad = b"caf\xe9 latin-1".decode("utf-8", "surrogateescape")  # what a terminal in another encoding passes
    run = subprocess.run(
        [sys.executable, "-m", "client", "embed", "fine", bad, "--url", server.grpc_url],
        capture_output=True, text=True, errors="surrogateescape", timeout=60,
    )  # fmt: skip
    assert run.returncode == 1 and r"text[1] 'caf\udce9 latin-1' is not valid Unicode" in run.stderr, run.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_async_client_answers_as_the_blocking_one(server, sentences, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    texts = sentences[:5] * 60  # 300 texts: over max_batch_size (256), so sent as two requests and joined
    with TextClient(url, protocol) as client:
        expected = client.embed(texts)

    async def embed() -> np.ndarray:
        async with AsyncTextClient(url, protocol) as client:
            return await client.embed(texts)

    got = asyncio.run(embed())
    assert got.shape == (300, 384)
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
