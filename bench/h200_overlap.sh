#!/usr/bin/env bash
# One device call on the H200: the one-stage model with and without tokenizing one part of a batch while the GPU
# runs the part before (engine option overlap_parts, model_repository/stages/pipeline_model.py), at each count of
# INSTANCES; direct gRPC, one text per request (python -m bench.e2e_bench, perf_analyzer) at SHAPES, with the
# engine's own figure from the same call. Each server is SETTINGS (BERT-base, 8 instances) with its instance count
# and options replaced. Run from the repo root with .kit carried; EXPORT=0 when the model is exported already.
OUT=${OUT:-/tmp/h200_overlap}
# shellcheck source=bench/device_preamble.sh
source bench/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes 16,64,1024 2>&1 | tail -4
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
files=()
for instances in ${INSTANCES:-8 4}; do
  for parts in ${OVERLAP_PARTS:-1 2}; do
    file=$OUT/i${instances}-overlap${parts}.toml
    sed -e "s/^instances = 8/instances = $instances/" -e "s/^precision = \"fp16\"/precision = \"fp16\"\noptions = {overlap_parts = $parts}/" \
      "$SETTINGS" > "$file"
    files+=(--settings "$file")
  done
done
python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null
python3 -m bench.e2e_bench "${files[@]}" --shapes "${SHAPES:-1x64,1x256}" --interval-ms "${INTERVAL_MS:-3000}" \
  --texts 4000 --out "$OUT" 2>&1 | tee "$OUT/e2e_bench.log" | grep -v '^\s*$' | tail -40
