#!/usr/bin/env bash
# One device call on the H200 (the device tool runs it from the repo root with .kit carried):
# export BERT-base (random init), engine-only benchmark, then the end-to-end perf_analyzer sweep through
# the real tritonserver. Everything it reports lands in $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_out}
mkdir -p "$OUT"
IMAGE_PYTHON=${IMAGE_PYTHON:-/opt/torch/.venv/bin/python3}
SETTINGS=${SETTINGS:-bench/bert-base-h200.toml}
CONCURRENCY=${CONCURRENCY:-1,8,32,64,128,200,256}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
echo "GPU: $GPU_NAME"

# Export and the engine benchmark's transformers baseline run in the image's own Python (numpy 2).
if [ "${EXPORT:-1}" = 1 ]; then
  "$IMAGE_PYTHON" -m export --settings "$SETTINGS" --tokenizer .kit/tokenizer.json > "$OUT/export.log" 2>&1 || { tail -30 "$OUT/export.log"; exit 1; }
  tail -4 "$OUT/export.log"
fi
if [ "${ENGINE_BENCH:-1}" = 1 ]; then
  "$IMAGE_PYTHON" bench/engine_bench.py --out "$OUT" 2>&1 | tee "$OUT/engine_bench.log" | tail -25
fi

# Triton 2.51's stub needs numpy < 2: the kit's venv (numpy 1.26, the image's torch through a .pth).
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS"
python3 -m bench.e2e_bench --settings "$SETTINGS" --perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" \
  --concurrency "$CONCURRENCY" --out "$OUT" 2>&1 | tee "$OUT/e2e_bench.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/e2e_bench.log" 2>/dev/null || true
