#!/usr/bin/env bash
# One device call on the H200 (the device tool runs it from the repo root with .kit carried): export
# BERT-base (random init), the engine-only benchmark, then the end-to-end perf_analyzer sweep through the
# real tritonserver for each settings file in SETTINGS, one server after the other in this one call, then
# each of VARIANTS (";"-separated lists of overrides of the first settings file, e.g.
# "encoder.instances=4;engine.options.spin_us=0", or "mps" to run it under CUDA MPS; each measured at
# VARIANT_SHAPES). Results land in
# $OUT (the device tool brings back at most 8 files: the JSON results, the py-spy profile and two logs).
OUT=${OUT:-/tmp/h200_out}
EXPORT_LOG=/tmp/export.log  # not in $OUT: the device tool brings back few files
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml settings/variants/bert-base-h200-two-stage.toml}
SHAPES=${SHAPES:-1x1,1x8,1x32,1x64,8x64,1x128,1x200,1x256}
VARIANTS=${VARIANTS:-}  # variants separated by "|", the overrides of one by ";"
VARIANT_SHAPES=${VARIANT_SHAPES:-1x1,1x256}
ENGINE_BATCHES=${ENGINE_BATCHES:-1,8,32,128,512,1024}
read -r -a settings_files <<<"$SETTINGS"

# Export and the engine benchmark's transformers baseline run in the image's own Python (numpy 2). Every
# settings file here names the same model, so one export serves them all.
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "${settings_files[0]}"
fi
if [ "${ENGINE_BENCH:-1}" = 1 ]; then
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes "$ENGINE_BATCHES" \
    --idle-gaps-ms "${IDLE_GAPS_MS:-}" 2>&1 | tee /tmp/engine_bench.log | tail -14
fi

# Triton 2.51's stub needs numpy < 2: the kit's venv (numpy 1.26, the image's torch through a .pth).
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
args=()
for f in "${settings_files[@]}"; do args+=(--settings "$f"); done
common=(--perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" --warmup-s 8 --interval-ms "${INTERVAL_MS:-2000}")
python3 -m bench.e2e_bench "${args[@]}" "${common[@]}" --shapes "$SHAPES" --profile ensemble \
  --out "$OUT/e2e" 2>&1 | tee "$OUT/e2e_bench.log"
IFS='|' read -r -a variants <<<"$VARIANTS"
for i in "${!variants[@]}"; do
  IFS=';' read -r -a overrides <<<"${variants[$i]}"
  sets=() mps=0
  for o in "${overrides[@]}"; do
    # "mps": this variant runs under CUDA MPS, so that the instances' kernels share the GPU at once.
    if [ "$o" = mps ]; then mps=1; else sets+=(--set "$o"); fi
  done
  [ "$mps" = 1 ] && { nvidia-cuda-mps-control -d || echo "variant $i: MPS did not start"; }
  echo "variant $i: ${variants[$i]}" | tee -a "$OUT/variants.log"
  python3 -m bench.e2e_bench --settings "${settings_files[0]}" "${sets[@]}" "${common[@]}" \
    --shapes "$VARIANT_SHAPES" --out "$OUT/variant$i" 2>&1 | tee -a "$OUT/variants.log" || echo "variant $i failed"
  [ "$mps" = 1 ] && { echo quit | nvidia-cuda-mps-control || true; sleep 2; }
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/e2e_bench.log" 2>/dev/null || true
