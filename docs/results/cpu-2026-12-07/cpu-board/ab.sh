#!/usr/bin/env bash
# Queries only (one text a request, /v1/embeddings base64) on 2 cores: d7a6495 (before: no board on CPUs, every
# query to the lane) against the working tree (a board on CPUs too), alternating; bench.api_cost, CPU from /proc.
# SET: the settings overrides of both trees (e.g. "encoder.instances=2 engine.threads=1").
set -u
OUTDIR=${OUTDIR:-/tmp/cpub/ab}
mkdir -p $OUTDIR
flags=(); for s in ${SET:-}; do flags+=(--set "$s"); done
for round in ${ROUNDS:-1 2 3}; do
  for pair in before:/tmp/ts/before after:/work/main; do
    name=${pair%%:*} folder=${pair#*:}
    cd $folder
    /work/main/.venv/bin/python -m model_repository.generate --settings /tmp/tiny/tiny.toml "${flags[@]}" > /dev/null
    /work/main/.venv/bin/python -m bench.api_cost --settings /tmp/tiny/tiny.toml "${flags[@]}" --generator python \
      --processes 1 --routes api-base64 --concurrency ${CONCURRENCY:-1 8 32} --duration-s ${DURATION:-6} --rounds 1 \
      --out $OUTDIR/$name-$round > $OUTDIR/$name-$round.log 2>&1
    echo "$name $round $(grep '^c=' $OUTDIR/$name-$round.log | cut -d' ' -f1-3 | tr '\n' ' ')"
  done
done
