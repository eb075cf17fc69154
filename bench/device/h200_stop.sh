#!/usr/bin/env bash
# The stop of a GPU server on the H200: for each of STOP_INSTANCES, the launcher serving SETTINGS with that
# many instances, a load (1 text x 64 in flight), then SIGTERM; the log says how long the drain and
# tritonserver's unload took and with which exit code. The settings' own [server] bounds, or SERVER_SETTINGS
# (TOML lines for [server], e.g. "exit_timeout_s = 60", or "unload_s_per_stub = 0" for the bound before it
# allowed for unloading). Run from the repo root with .kit carried; EXPORT=0 when the model is exported already. Results land in
# $OUT.
OUT=${OUT:-/tmp/h200_stop}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
STOP_INSTANCES=${STOP_INSTANCES:-8 16}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for instances in $STOP_INSTANCES; do
  settings=/tmp/stop-$instances.toml
  sed "s/^instances = .*/instances = $instances/" "$SETTINGS" > "$settings"
  if [ -n "${SERVER_SETTINGS:-}" ]; then
    printf '\n[server]\n%s\n' "$SERVER_SETTINGS" >> "$settings"
  fi
  python3 -m model_repository.generate --settings "$settings" > /dev/null
  log="$OUT/stop-$instances${LOG_SUFFIX:-}.log"
  python3 -m serving.launcher --settings "$settings" > "$log" 2>&1 &
  launcher=$!
  wait_ready http://127.0.0.1:8003/ready "$launcher" "$log"
  python3 -m bench.e2e_bench --settings "$settings" --url 127.0.0.1:8001 --perf-analyzer "$PERF_ANALYZER" \
    --shapes 1x64 --interval-ms 2000 --out "/tmp/stop-$instances" > /dev/null 2>&1 || echo "load failed"
  signalled=$(date +%s.%N)
  kill -TERM "$launcher"
  code=0
  wait "$launcher" || code=$?
  echo "$instances instances: the launcher exited with $code, $(python3 -c "print(round($(date +%s.%N) - $signalled, 1))") s after SIGTERM" | tee -a "$log"
  grep -E "launcher: (drain|tritonserver exited)|unloaded|Timeout 0|failed to stop" "$log" | tail -6
done
