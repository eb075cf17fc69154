"""Health of a serving Triton, judged by one real inference: `python3 docker/healthcheck.py [--url URL]`.

Triton 2.51's /v2/health/ready keeps answering 200 after a Python-backend stub died, while every request
through the ensemble then fails. So this sends one one-text request to /v2/models/<model>/infer (KServe v2
JSON; a reranker's with a query beside the text, as its metadata asks) for each --model, and exits 0 only
when each answers HTTP 200 with outputs; 1 otherwise, with the reason on stderr.

The server image's HEALTHCHECK and the Helm chart's readiness probe run it. With BERT_TRITON_API_KEY set
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="healthcheck.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("HEALTHCHECK_URL", DEFAULT_URL), help="Triton HTTP endpoint")
    parser.add_argument(
        "--model", action="append", help="a served model to check; repeat for several (default: ensemble)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds, per model")
    args = parser.parse_args(argv)
    for model in args.model or ["ensemble"]:
        reason = problem(args.url, model, args.timeout)
        if reason:
            print(f"unhealthy: {model}: {reason}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
