#!/usr/bin/env bash
# One device call on the H200: the API front with and without coalescing (python -m bench.api_cost: direct gRPC,
# /v1/embeddings base64 and float through the coalescing front, base64 through a front with
# api.coalesce_calls = 0, alternating rounds on one tritonserver) at CONCURRENCY, with the engine's own figure
# from the same call. API_SETTINGS: TOML lines for [api] added to SETTINGS (e.g. "coalesce_calls = 8");
# API_COST_ARGS: more flags of bench.api_cost (e.g. "--routes grpc api-base64 --profile").
# Run from the repo root with .kit carried; EXPORT=0 when the model is exported already. Results land in $OUT.
OUT=${OUT:-/tmp/h200_coalescing}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
CONCURRENCY=${CONCURRENCY:-1 64 256}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 1,64,1024 2>&1 | tail -5
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
if [ -n "${API_SETTINGS:-}" ]; then
  if grep -q '^\[api\]' "$SETTINGS"; then
    awk -v lines="$API_SETTINGS" '{ print } /^\[api\]/ { print lines }' "$SETTINGS" > /tmp/coalescing.toml
  else
    { cat "$SETTINGS"; printf '\n[api]\n%s\n' "$API_SETTINGS"; } > /tmp/coalescing.toml
  fi
  SETTINGS=/tmp/coalescing.toml
fi
python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null
# shellcheck disable=SC2086
python3 -m bench.api_cost --settings "$SETTINGS" --concurrency $CONCURRENCY --processes "${PROCESSES:-4}" \
  --duration-s "${DURATION_S:-8}" --rounds "${ROUNDS:-2}" --out "$OUT" ${API_COST_ARGS:-} 2>&1 | tee "$OUT/api_cost.log" | grep "^c="
python3 -m bench.plot "$OUT/api_cost.json" > /dev/null 2>&1 || echo "no plot (matplotlib?)"
