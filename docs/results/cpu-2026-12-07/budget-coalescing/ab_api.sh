#!/usr/bin/env bash
# main (/tmp/ab2/main) against the coalesced budgets (/tmp/ab2/coal): /v1 with X-Request-Timeout: 1s, c=64, both generators
for round in 1 2 3; do
  for tree in main coal; do
    for gen in perf_analyzer python; do
      (cd /tmp/ab2/$tree && PERF_ANALYZER=/tmp/pa/perf_analyzer LD_LIBRARY_PATH=/tmp/pa/lib timeout 400 .venv/bin/python -m bench.api_cost \
        --settings tiny.toml --generator $gen --processes 2 --routes grpc api-base64 --concurrency 64 --header X-Request-Timeout:1s \
        --duration-s 5 --rounds 1 --out /tmp/ab2/cruns/$tree-$gen-$round > /tmp/ab2/cruns/$tree-$gen-$round.log 2>&1)
      echo "$tree $gen $round $(date -u +%T) $(grep '^c=' /tmp/ab2/cruns/$tree-$gen-$round.log | tr '\n' ' ')"
    done
  done
done
