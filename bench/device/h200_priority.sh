#!/usr/bin/env bash
# One device call on the H200: issue 35's priority benchmark. The engine alone (its own figure beside the served
# ones), then python -m bench.priority_bench on BERT-base: single-text queries at 50 req/s through /v1/embeddings
# beside 16 clients of 64 texts, with the query lane and with one queue, and 1,000 requests with a 5 ms budget
# against the saturated server. Run from the repo root with .kit carried; EXPORT=0 when the model is exported
# already. Results land in $OUT: engine_bench.json, priority_bench.json.
OUT=${OUT:-/tmp/h200_priority}
EXPORT_LOG=/tmp/export.log  # not in $OUT: the device tool brings back few files
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi
"$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 1,64,1024 2>&1 | tail -4
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m bench.priority_bench --settings "$SETTINGS" --query-rate 50 --ingestion-clients 16 \
  --ingestion-texts 64 --duration "${DURATION:-20}" --deadline-requests 1000 --budget-ms 5 --out "$OUT" 2>&1 | tail -4
