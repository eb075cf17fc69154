"""Health of a serving Triton, judged by one real inference: `python3 docker/healthcheck.py [--url URL]
[--api-url URL]`.

Triton 2.51's /v2/health/ready keeps answering 200 after a Python-backend stub died, while every request
through the ensemble then fails. So this sends one one-text request to /v2/models/<model>/infer (KServe v2
JSON; a reranker's with a query beside the text, as its metadata asks) for each --model, and exits 0 only
when each answers HTTP 200 with outputs; 1 otherwise, with the reason on stderr. With --api-url (the API front
in the same container, as the server image runs it) the front must also answer: its /health (the launcher's
/ready: Triton ready, every stub alive, not draining) and one embedding through /v1/embeddings (api_problem).

The server image's HEALTHCHECK (with --api-url) and the Helm chart's readiness probe (without: the chart runs the
API front in a container of its own, with a probe of its own) run it. With BERT_TRITON_API_KEY set
(the server's key, protocol/api_key.py) the inference carries it. Standard library only, so it runs with any
python3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000"


def _key_header() -> dict[str, str]:
    key = os.environ.get("BERT_TRITON_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _inputs(url: str, model: str, timeout_s: float) -> list[str]:
    """The model's input names, from its metadata (text, and a reranker's query)."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/v2/models/{model}", timeout=timeout_s) as response:
        return [tensor["name"] for tensor in json.loads(response.read())["inputs"]]


def problem(url: str, model: str = "ensemble", timeout_s: float = 5.0) -> str | None:
    """Why the server at url cannot serve `model` now, or None when one inference succeeds."""
    try:
        names = _inputs(url, model, timeout_s)
        inputs = [{"name": name, "datatype": "BYTES", "shape": [1, 1], "data": ["ready?"]} for name in names]
        request = urllib.request.Request(
            f"{url.rstrip('/')}/v2/models/{model}/infer",
            data=json.dumps({"inputs": inputs}).encode(),
            headers={"Content-Type": "application/json", **_key_header()},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
    except (urllib.error.URLError, OSError) as exc:
        return f"no answer from {url}: {getattr(exc, 'reason', exc)}"
    except (ValueError, KeyError) as exc:
        return f"unreadable metadata of {model}: {exc}"
    if status != 200:
        return f"HTTP {status}"
    try:
        outputs = json.loads(body).get("outputs")
    except ValueError:
        outputs = None
    return None if outputs else "the response holds no outputs"


def _api_call(url: str, body: dict | None, timeout_s: float) -> tuple[int, dict]:
    """(status, JSON answer) of a GET (body None) or POST to the API front; an error status is returned."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **_key_header()})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def api_problem(api_url: str, timeout_s: float = 5.0) -> str | None:
    """Why the API front at api_url does not answer /v1 now, or None: its /health answers 200 and one text gets its
    embedding from /v1/embeddings (the front's own gRPC channels to Triton may still be reconnecting when Triton
    and /health already answer). A server with no embedding model answers that 400 naming `model`: then /v1/models
    must answer 200."""
    base = api_url.rstrip("/")
    try:
        for path, body in (("/health", None), ("/v1/embeddings", {"input": ["ready?"]})):
            status, answer = _api_call(base + path, body, timeout_s)
            if path == "/v1/embeddings" and status == 400 and answer.get("error", {}).get("param") == "model":
                path, (status, answer) = "/v1/models", _api_call(base + "/v1/models", None, timeout_s)
            if status != 200:
                return f"{path}: HTTP {status}: {json.dumps(answer)[:300]}"
    except (urllib.error.URLError, OSError) as exc:
        return f"no answer from {base}: {getattr(exc, 'reason', exc)}"
    except ValueError as exc:
        return f"an answer of {base} is not JSON: {exc}"
    return None if answer.get("data") else f"{path} answered no data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="healthcheck.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("HEALTHCHECK_URL", DEFAULT_URL), help="Triton HTTP endpoint")
    parser.add_argument(
        "--model", action="append", help="a served model to check; repeat for several (default: ensemble)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds, per model")
    parser.add_argument("--api-url", help="the API front, which must answer /health and /v1/embeddings too")
    args = parser.parse_args(argv)
    for model in args.model or ["ensemble"]:
        reason = problem(args.url, model, args.timeout)
        if reason:
            print(f"unhealthy: {model}: {reason}", file=sys.stderr)
            return 1
    reason = args.api_url and api_problem(args.api_url, args.timeout)
    if reason:
        print(f"unhealthy: API front: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
