"""python -m client embed|classify TEXT... : send texts to the ensemble and print JSON.

Texts come from the arguments, or one per line from standard input when the only argument is "-".
"""

from __future__ import annotations

import argparse
import json
import sys

from client.core import PROTOCOLS, ClientError, RetryPolicy, TextClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    parser.add_argument("command", choices=("embed", "classify"))
    parser.add_argument("texts", nargs="+", help='texts to send, or "-" to read one per line from stdin')
    parser.add_argument("--url", help="host:port, or http://host:port (default: from the settings, per protocol)")
    parser.add_argument("--protocol", choices=PROTOCOLS, help="default: the URL's scheme, else grpc")
    parser.add_argument("--model", default="ensemble")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline per call in seconds, retries included")
    parser.add_argument(
        "--retries", type=int, help="total tries when the server is unavailable (default: until the deadline)"
    )
    args = parser.parse_args(argv)
    texts = sys.stdin.read().splitlines() if args.texts == ["-"] else args.texts
    try:
        with TextClient(
            args.url, args.protocol, args.model, args.timeout, RetryPolicy(attempts=args.retries)
        ) as client:
            outputs = client.infer(texts)
    except (ClientError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "embed":
        if "embedding" not in outputs:
            print("error: the model returns no embeddings (is it a classification model?)", file=sys.stderr)
            return 1
        result = {"model": args.model, "embeddings": outputs["embedding"].tolist()}
    else:
        if "label" not in outputs:
            print("error: the model returns no labels (is it an embedding model?)", file=sys.stderr)
            return 1
        result = {"model": args.model, "labels": outputs["label"].tolist(), "scores": outputs["scores"].tolist()}
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
