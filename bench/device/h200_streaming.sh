#!/usr/bin/env bash
# One device call on the H200 for the streaming model (issue 36): the engine alone (forward, and pipelined as the
# streaming model runs it: batch n + 1 launched before batch n is collected), then one launcher on SETTINGS
# (settings/variants/bert-base-h200.toml: the unary ensemble's instances, its query lane and <model>-stream), on
# which perf_analyzer measures unary gRPC (model ensemble) and gRPC streams (ensemble-stream) at SHAPES, with each
# stub's CPU, GPU memory after. PART=api instead runs bench.api_cost (perf_analyzer as the load generator):
# /v1/embeddings over the streaming model against direct unary gRPC and streams, at CONCURRENCY, then with
# `--set stream.enabled=false` (the front over unary calls, as before the streaming model) when BEFORE=1.
# SET: more --set overrides for both (e.g. "stream.instances=2"); ENGINE=0 skips the engine's figure (either PART), MODELS names
# the models to measure (default: ensemble-stream ensemble); LOCUST="grpc-stream grpc" then runs python -m loadtest
# (the settings' bar, 4 processes, LOCUST_DURATION) once per protocol on the same server. Run from the repo root with .kit carried.
OUT=${OUT:-/tmp/h200_streaming}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
SHAPES=${SHAPES:-1x1,1x64,8x64,64x8,1x256}  # the last one profiled (py-spy on the stream stub)
PART=${PART:-grpc}
SET_FLAGS=()
for override in ${SET:-}; do SET_FLAGS+=(--set "$override"); done
if [ ! -f build/models/bert-base-random/model.safetensors ]; then
  export_model "$SETTINGS"
fi
if [ "${ENGINE:-1}" = 1 ]; then
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes "${ENGINE_BATCHES:-16,64,1024}" 2>&1 \
    | grep "^engine"
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh

if [ "$PART" = api ]; then
  python3 -m model_repository.generate --settings "$SETTINGS" "${SET_FLAGS[@]}" > /dev/null
  # shellcheck disable=SC2086
  python3 -m bench.api_cost --settings "$SETTINGS" "${SET_FLAGS[@]}" --generator perf_analyzer \
    --routes grpc grpc-stream api-base64 --concurrency ${CONCURRENCY:-1 64 256} --processes "${PROCESSES:-16}" \
    --duration-s "${DURATION_S:-6}" --rounds 1 --out "$OUT/api-stream" 2>&1 | tee "$OUT/api-stream.log" | grep "^c="
  if [ "${BEFORE:-0}" = 1 ]; then
    python3 -m model_repository.generate --settings "$SETTINGS" "${SET_FLAGS[@]}" --set stream.enabled=false > /dev/null
    # shellcheck disable=SC2086
    python3 -m bench.api_cost --settings "$SETTINGS" "${SET_FLAGS[@]}" --set stream.enabled=false \
      --generator perf_analyzer --routes grpc api-base64 --concurrency ${CONCURRENCY:-1 64 256} \
      --processes "${PROCESSES:-16}" --duration-s "${DURATION_S:-6}" --rounds 1 --out "$OUT/api-unary" 2>&1 \
      | tee "$OUT/api-unary.log" | grep "^c="
  fi
  exit 0
fi

python3 -m model_repository.generate --settings "$SETTINGS" "${SET_FLAGS[@]}" > /dev/null
python3 -m serving.launcher --settings "$SETTINGS" "${SET_FLAGS[@]}" > "$OUT/server.out" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
wait_ready http://127.0.0.1:8003/ready "$SERVER_PID" "$OUT/server.out" 240
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu-memory-idle.csv"
for model in ${MODELS:-ensemble-stream ensemble}; do
  shapes=$SHAPES
  [ "$model" = ensemble ] && shapes=${UNARY_SHAPES:-1x256,1x64,1x1}
  profile=()
  [ "$model" = ensemble-stream ] && profile=(--profile ensemble-stream --profile-idle)
  python3 -m bench.e2e_bench --settings "$SETTINGS" --url 127.0.0.1:8001 --model "$model" \
    --perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" --shapes "$shapes" --interval-ms 2000 \
    "${profile[@]}" --out "$OUT/$model" 2>&1 | tee "$OUT/$model.log" | grep -v "^ "
done
for protocol in ${LOCUST:-}; do  # e.g. LOCUST="grpc-stream grpc": the settings' acceptance bar, each protocol
  # Exit 1 = the bar was missed: a result to report, not a failed measurement.
  python3 -m loadtest --settings "$SETTINGS" --url 127.0.0.1:8001 --metrics-url 127.0.0.1:8002 --protocol "$protocol" \
    --duration "${LOCUST_DURATION:-20s}" --processes 4 --results "$OUT/loadtest-$protocol" 2>&1 | tail -1 || true
  tar -C "$OUT" -czf "$OUT/loadtest-$protocol.tar.gz" "loadtest-$protocol" && rm -rf "${OUT:?}/loadtest-$protocol"
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu-memory-after.csv"
grep -i "error\|stream:" "$OUT/server.out" | tail -5 || true
# The device tool brings back a limited number of files: each run's folder as one archive.
for model in ${MODELS:-ensemble-stream ensemble}; do
  tar -C "$OUT" -czf "$OUT/$model.tar.gz" "$model" && rm -rf "${OUT:?}/$model"
done
