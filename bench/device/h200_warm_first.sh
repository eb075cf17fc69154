#!/usr/bin/env bash
# One device call on the H200: encoder.warm_first (the first instance takes what arrives while it is free, by
# Triton's rate limiter) against Triton's own hand-out (the longest idle instance), python -m bench.e2e_bench
# with perf_analyzer over gRPC, each server in turn and then again in the other order, beside the engine's own
# figure. Run from the repo root with .kit carried; EXPORT=0 when the model is exported already. Results land in
# $OUT: engine_bench.json, {off,on}-{1,2}/e2e_bench.json.
OUT=${OUT:-/tmp/h200_warm_first}
EXPORT_LOG=/tmp/export.log  # not in $OUT: the device tool brings back few files
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
SHAPES=${SHAPES:-1x1,1x64,1x256,8x64}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi
"$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 1,16,64,1024 2>&1 | tail -6
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
common=(--settings "$SETTINGS" --perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" --warmup-s 5
  --interval-ms "${INTERVAL_MS:-2000}" --shapes "$SHAPES")
for run in off-1 on-1 on-2 off-2; do
  value=$([ "${run%-*}" = on ] && echo true || echo false)
  echo "encoder.warm_first=$value ($run)"
  python3 -m bench.e2e_bench "${common[@]}" --set "encoder.warm_first=$value" --out "$OUT/$run" 2>&1 | grep "texts/s"
done
