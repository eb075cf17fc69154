#!/usr/bin/env bash
# One device call on the H200: an embedder and a reranker, BERT-base sizes (random weights), served alone and
# together (python -m bench.several_models), the torch engine's cross-encoder GPU test, and the stop of a GPU
# server: SIGTERM to the launcher after a load, with STOP_INSTANCES instances (each run with a generous
# exit timeout, so that its log says how long the drain and tritonserver's unload take). Run from the repo
# root with .kit carried; results land in $OUT.
OUT=${OUT:-/tmp/h200_several_models}
# shellcheck source=bench/device_preamble.sh
source bench/device_preamble.sh
EMBEDDER=settings/variants/bert-base-h200.toml
RERANKER=settings/variants/reranker-bert-base-h200.toml
SHAPES=${SHAPES:---shape 1x256 --shape 32x16}
STOP_INSTANCES=${STOP_INSTANCES:-8 16}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$EMBEDDER"
  export_model "$RERANKER"
fi
("$IMAGE_PYTHON" -m pytest -q -m gpu tests/model/test_engine_torch.py -k cross_encoder -p no:cacheprovider -s || true) \
  2>&1 | tail -30 | tee "$OUT/test-gpu.log"

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
# shellcheck disable=SC2086
python3 -m bench.several_models --settings "$EMBEDDER" "$RERANKER" $SHAPES --perf-analyzer "$PERF_ANALYZER" \
  --out "$OUT" 2>&1 | tee "$OUT/several_models.log"

for instances in $STOP_INSTANCES; do
  settings=/tmp/stop-$instances.toml
  { cat "$EMBEDDER"; printf '\n[server]\nexit_timeout_s = 60\n'; } |
    sed "s/^instances = .*/instances = $instances/" > "$settings"
  python3 -m model_repository.generate --settings "$settings" > /dev/null
  log="$OUT/stop-$instances.log"
  python3 -m serving.launcher --settings "$settings" > "$log" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do
    python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8003/ready", timeout=2)' 2>/dev/null && break
    sleep 0.5
  done
  python3 -m bench.e2e_bench --settings "$settings" --url 127.0.0.1:8001 --perf-analyzer "$PERF_ANALYZER" \
    --shapes 1x64 --interval-ms 2000 --out "/tmp/stop-$instances" > /dev/null 2>&1 || echo "load failed"
  signalled=$(date +%s.%N)
  kill -TERM "$launcher"
  code=0
  wait "$launcher" || code=$?
  echo "$instances instances: the launcher exited with $code, $(python3 -c "print(round($(date +%s.%N) - $signalled, 1))") s after SIGTERM" | tee -a "$log"
  grep -E "launcher: (drain|tritonserver exited)|unloaded|Timeout 0|failed to stop" "$log" | tail -6
done
