#!/usr/bin/env bash
# One device call on the H200 for the acceptance bar (issue 5): one tritonserver with the GPU ensemble
# (settings/variants/bert-base-h200.toml), then against that same server
#   1. perf_analyzer, closed loop, concurrency 200 (python -m bench.e2e_bench --url ...), and
#   2. Locust, closed loop, 200 users (python -m loadtest ...), once per LOCUST_PROCESSES entry,
# each recording its own CPU cost. Run from the repo root with .kit carried; everything lands in $OUT.
OUT=${OUT:-/tmp/h200_acceptance}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
USERS=${USERS:-200}
DURATION=${DURATION:-60s}
LOCUST_PROCESSES=${LOCUST_PROCESSES:-4 8}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS"
python3 -m serving.launcher --settings "$SETTINGS" > "$OUT/server.out" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; pack_out' EXIT
wait_ready http://127.0.0.1:8000/v2/models/ensemble/ready "$SERVER_PID" "$OUT/server.out" 120

python3 -m bench.e2e_bench --settings "$SETTINGS" --url 127.0.0.1:8001 --perf-analyzer "$PERF_ANALYZER" \
  --gpu-name "$GPU_NAME" --shapes "1x$USERS" --out "$OUT" 2>&1 | tee "$OUT/e2e_bench.log"

for processes in $LOCUST_PROCESSES; do
  # Exit 1 = the bar was missed: that is a result to report, not a failed measurement.
  python3 -m loadtest --settings "$SETTINGS" --url 127.0.0.1:8001 --metrics-url 127.0.0.1:8002 \
    --users "$USERS" --duration "$DURATION" --processes "$processes" --results "$OUT/loadtest-p$processes" \
    2>&1 | tee "$OUT/loadtest-p$processes.log" | tail -25 || true
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/e2e_bench.log" 2>/dev/null || true
