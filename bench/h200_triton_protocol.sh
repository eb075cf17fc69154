#!/usr/bin/env bash
# One device call on the H200: the API front calling tritonserver over gRPC, then over HTTP (api.triton_protocol),
# each measured by python -m bench.api_cost on its own launcher with direct gRPC beside it as the yardstick of the
# machine state. Run from the repo root with .kit carried. CONCURRENCY, ROUTES, DURATION_S, PROCESSES pass on
# to bench.api_cost. Results land in $OUT/grpc and $OUT/http.
OUT=${OUT:-/tmp/h200_triton_protocol}
# shellcheck source=bench/device_preamble.sh
source bench/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
export_model "$SETTINGS"
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null
for protocol in grpc http; do
  mkdir -p "$OUT/$protocol"
  variant="$OUT/$protocol/settings.toml"  # the settings with only api.triton_protocol changed
  sed "s/^\[api\]$/[api]\ntriton_protocol = \"$protocol\"/" "$SETTINGS" > "$variant"
  grep -q "^triton_protocol = \"$protocol\"" "$variant"
  echo "api.triton_protocol = $protocol:"
  # shellcheck disable=SC2086
  python3 -m bench.api_cost --settings "$variant" --concurrency ${CONCURRENCY:-1 256} \
    --routes ${ROUTES:-grpc api-base64} --processes "${PROCESSES:-4}" --duration-s "${DURATION_S:-4}" --rounds 1 \
    --out "$OUT/$protocol" 2>&1 | tee "$OUT/$protocol/api_cost.log" | grep "^c="
  rm -f "$OUT/$protocol/api_cost_launcher.log"  # the device call brings back 8 files at most
done
