#!/usr/bin/env bash
# c=1 direct gRPC: b55987f against main, engine alone and end to end with py-spy on the one stub.
OUT=${OUT:-/tmp/probe}
source bench/device/device_preamble.sh
SETTINGS=settings/variants/bert-base-h200.toml
ROOT=$(pwd)
for pair in b55:.trees/b55 new:.; do
  folder=${pair#*:}
  [ -f "$folder/build/models/bert-base-random/model.safetensors" ] && continue
  (cd "$folder" && "$IMAGE_PYTHON" -m export --settings "$SETTINGS" --tokenizer "$ROOT/.kit/tokenizer.json" > /tmp/export-${pair%%:*}.log 2>&1) &
done
wait
[ -n "${SKIP_ENGINE:-}" ] || for pair in b55:.trees/b55 new:.; do
  name=${pair%%:*} folder=${pair#*:}
  (cd "$folder" && "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT/$name-engine" --no-baseline --batch-sizes 1,8,64 2>&1 | grep "^engine bs")
done
source bench/device_env.sh
"$IMAGE_PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target /tmp/site .whl/*.whl
export PY_SPY=/tmp/site/bin/py-spy
for round in 1 2; do
for pair in b55:.trees/b55 new:.; do
  name=${pair%%:*} folder=${pair#*:}
  prof=()
  [ $round = 2 ] && prof=(--profile ensemble --profile-idle)
  echo "== $name round $round"
  (cd "$folder" && python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null &&
   python3 -m bench.e2e_bench --settings "$SETTINGS" --perf-analyzer "$PERF_ANALYZER" \
    --gpu-name "$GPU_NAME" --shapes 1x1 --interval-ms 2000 "${prof[@]}" --out "$OUT/$name-e2e-$round" 2>&1 \
    | grep -v "^ " | tail -4)
done
done
