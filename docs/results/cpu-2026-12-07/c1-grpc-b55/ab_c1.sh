#!/usr/bin/env bash
# c=1 direct gRPC on 2 cores: b55987f against main, alternating, CPU per request from /proc (bench.api_cost).
set -u
for round in 1 2 3; do
  for pair in b55:/tmp/ts/b55 main:/work/main; do
    name=${pair%%:*} folder=${pair#*:}
    cd $folder
    /work/main/.venv/bin/python -m model_repository.generate --settings /tmp/tiny/tiny.toml > /dev/null
    /work/main/.venv/bin/python -m bench.api_cost --settings /tmp/tiny/tiny.toml --generator python --processes 1 \
      --routes grpc --concurrency 1 --duration-s 8 --rounds 1 --out /tmp/tiny/ab/$name-$round > /tmp/tiny/ab/$name-$round.log 2>&1
    echo "$name $round $(grep '^c=' /tmp/tiny/ab/$name-$round.log)"
  done
done
