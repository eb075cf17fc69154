#!/usr/bin/env bash
# One device call on the H200: where a lone request's time goes (one text per request, one in flight). The
# engine alone at batch 1 (back to back, and after 2 ms idle, as a lone client leaves it); python -m
# bench.e2e_bench at 1x1 with one instance, its stub sampled by py-spy with the waits, then with the
# settings' own instances; python -m bench.api_cost at c=1 (direct gRPC and /v1/embeddings base64) with one
# API worker, sampled by py-spy. Run from the repo root with .kit carried; EXPORT=0 when the model is exported
# already. Results land in $OUT (at most 8 files come back): engine_bench.json, one-instance/, instances/, api/.
OUT=${OUT:-/tmp/h200_latency}
EXPORT_LOG=/tmp/export.log  # not in $OUT: the device tool brings back few files
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi
"$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 1 --idle-gaps-ms 0,2 2>&1 | tail -4
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
lone=(--perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" --warmup-s 5 --interval-ms 3000 --shapes 1x1)
python3 -m bench.e2e_bench --settings "$SETTINGS" --set encoder.instances=1 "${lone[@]}" --profile ensemble \
  --profile-idle --out "$OUT/one-instance" 2>&1 | tail -3
python3 -m bench.e2e_bench --settings "$SETTINGS" "${lone[@]}" --out "$OUT/instances" 2>&1 | tail -3
# bench.api_cost takes a settings file, not overrides, so one API worker needs a file of its own.
one_worker=settings/variants/one-api-worker.toml
sed 's/^workers = .*/workers = 1/' "$SETTINGS" > "$one_worker"
python3 -m model_repository.generate --settings "$one_worker" > /dev/null
python3 -m bench.api_cost --settings "$one_worker" --concurrency 1 --routes grpc api-base64 --processes 1 \
  --duration-s 8 --rounds 3 --profile --out "$OUT/api" 2>&1 | grep "^c="
