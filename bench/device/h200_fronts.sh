#!/usr/bin/env bash
# One device call on the H200: the API front of this tree against the one of BEFORE (a tarball of another
# revision, `git archive REV | gzip > .kit/before.tar.gz`), each measured by python -m bench.api_cost on its
# own launcher, one after the other (direct gRPC in each run is the yardstick of the machine state), with the
# engine's own figure from the same call. ROUTES, CONCURRENCY, ROUNDS, DURATION_S, PROCESSES, API_COST_ARGS pass
# on to bench.api_cost. (HTTP_SERVERS=1, which added a concluded probe, is gone: docs/probes.md.)
# Run from the repo root with .kit carried; EXPORT=0 when the model is exported already. Results land in $OUT:
# after/ (this tree), before/ (BEFORE's).
OUT=${OUT:-/tmp/h200_fronts}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 1,64,1024 2>&1 | tail -5
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh

api_cost() {  # api_cost TREE OUT
  mkdir -p "$2"
  # shellcheck disable=SC2086
  (cd "$1" && python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null \
    && python3 -m bench.api_cost --settings "$SETTINGS" --concurrency ${CONCURRENCY:-1 64 256} \
      --routes ${ROUTES:-grpc api-base64 api-float} --processes "${PROCESSES:-4}" --duration-s "${DURATION_S:-8}" \
      --rounds "${ROUNDS:-1}" --out "$2" ${API_COST_ARGS:-} 2>&1 | tee "$2/api_cost.log" | grep "^c=")
}

echo "this tree:"
api_cost "$PWD" "$OUT/after"
if [ -n "${BEFORE:-}" ]; then
  rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf "$BEFORE" -C /tmp/before
  ln -s "$PWD/build" /tmp/before/build  # the same export; each tree generates its own repository into it
  echo "before ($BEFORE):"
  api_cost /tmp/before "$OUT/before"
fi
