"""python -m client embed|embed-sparse|embed-multi-vector|classify|rerank TEXT... : send texts to a served model
and print JSON.

Texts come from the arguments, or one per line from standard input when the only argument is "-". rerank
takes the query first (--query), then the texts to score against it; embed-sparse prints each text's
non-zero vocabulary entries ({"index", "value"}, TEI's shape), its --top-k largest above --threshold if given;
embed-multi-vector each text's token vectors ([[float, ...] per token], TEI's /embed_all shape), the texts encoded
as --input-type query or document (the default).
On a server of several models, --model names one (by its model.name); a one-model server calls its model
`ensemble`, the default.
"""

from __future__ import annotations

import argparse
import json
import sys

from client.core import PROTOCOLS, ClientError, RetryPolicy, TextClient, side_parameters, sparse_parameters
from common.contract import INPUT_TYPES, SPARSE_INDICES, TOKEN_VECTORS
from protocol.multi_vector import token_vectors
from protocol.sparse import entries

OUTPUTS = {"embed": "embedding", "embed-sparse": SPARSE_INDICES, "embed-multi-vector": TOKEN_VECTORS,
           "classify": "label", "rerank": "score"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    parser.add_argument("command", choices=tuple(OUTPUTS))
    parser.add_argument("texts", nargs="+", help='texts to send, or "-" to read one per line from stdin')
    parser.add_argument("--query", help="rerank: the query the texts are scored against")
    parser.add_argument("--top-k", type=int, help="embed-sparse: keep each text's k largest entries")
    parser.add_argument("--threshold", type=float, help="embed-sparse: keep the entries above this weight")
    parser.add_argument("--input-type", choices=INPUT_TYPES, help="embed-multi-vector: the side (default document)")
    parser.add_argument("--url", help="host:port, or http://host:port (default: from the settings, per protocol)")
    parser.add_argument("--protocol", choices=PROTOCOLS, help="default: the URL's scheme, else grpc")
    parser.add_argument("--model", default="ensemble", help="the served model (default: ensemble, a one-model server)")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline per call in seconds, retries included")
    parser.add_argument(
        "--priority", choices=("query", "ingestion"), help="the class (default: by the number of texts)"
    )
    parser.add_argument(
        "--retries", type=int, help="total tries when the server is unavailable (default: until the deadline)"
    )
    args = parser.parse_args(argv)
    texts = sys.stdin.read().splitlines() if args.texts == ["-"] else args.texts
    if (args.command == "rerank") != (args.query is not None):
        print("error: --query goes with rerank, and rerank needs it", file=sys.stderr)
        return 2
    try:
        with TextClient(
            args.url, args.protocol, args.model, args.timeout, RetryPolicy(attempts=args.retries),
            priority=args.priority,
        ) as client:  # fmt: skip
            parameters = (
                side_parameters(args.input_type or "document")
                if args.command == "embed-multi-vector"
                else sparse_parameters(args.top_k, args.threshold)
            )
            outputs = client.infer(texts, args.query, parameters)
    except (ClientError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if OUTPUTS[args.command] not in outputs:
        kinds = {"embedding": "an embedding", SPARSE_INDICES: "a sparse", TOKEN_VECTORS: "a multi-vector",
                 "label": "a classification", "score": "a reranking"}  # fmt: skip
        print(f"error: {args.model} is not {kinds[OUTPUTS[args.command]]} model", file=sys.stderr)
        return 1
    result = {"model": args.model}
    if args.command == "embed":
        result["embeddings"] = outputs["embedding"].tolist()
    elif args.command == "embed-sparse":
        result["sparse"] = [
            [{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
            for indices, values in entries(outputs)
        ]
    elif args.command == "embed-multi-vector":
        result["token_vectors"] = [vectors.tolist() for vectors in token_vectors(outputs)]
    elif args.command == "classify":
        result |= {"labels": outputs["label"].tolist(), "scores": outputs["scores"].tolist()}
    else:
        result["scores"] = outputs["score"].reshape(-1).tolist()
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
