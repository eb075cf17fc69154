#!/usr/bin/env bash
for round in 1 2; do for tree in main coal; do
  (cd /tmp/ab2/$tree && timeout 300 .venv/bin/python /tmp/ab2/mixed.py tiny.toml /tmp/ab2/mixed-$tree-$round.json > /tmp/ab2/mixed-$tree-$round.log 2>&1)
  echo "$tree $round $(date -u +%T) $(tail -1 /tmp/ab2/mixed-$tree-$round.log)"
done; done
