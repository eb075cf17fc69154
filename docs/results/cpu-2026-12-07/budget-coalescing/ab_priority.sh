#!/usr/bin/env bash
# main against coal: budgeted requests beside ingestion on 2 cores (answer-margin-2cores' command)
for budget in 20 100; do
  for tree in main coal main coal; do
    n=$((${n:-0}+1))
    (cd /tmp/ab2/$tree && timeout 300 .venv/bin/python -m bench.priority_bench --settings tiny.toml --query-rate 20 \
      --ingestion-clients 2 --ingestion-texts 64 --duration 4 --deadline-requests 400 --budget-ms $budget \
      --deadline-processes 1 --modes lanes --out /tmp/ab2/pruns/b$budget-$n-$tree > /tmp/ab2/pruns/b$budget-$n-$tree.log 2>&1)
    echo "$budget $n $tree $(date -u +%T) rc=$?"
  done
done
