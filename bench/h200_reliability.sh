#!/usr/bin/env bash
# One device call on the H200: python -m loadtest.reliability against the GPU ensemble
# (bench/bert-base-h200.toml): stub kills of the tokenizer and the GPU encoder and a launcher restart
# under a closed-loop load, every request counted. Run from the repo root with .kit carried.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200_reliability}
mkdir -p "$OUT"
IMAGE_PYTHON=${IMAGE_PYTHON:-/opt/torch/.venv/bin/python3}
SETTINGS=${SETTINGS:-bench/bert-base-h200.toml}
USERS=${USERS:-64}
PHASE_SECONDS=${PHASE_SECONDS:-10}
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1), $(nproc) cores, $(date -u +%FT%TZ)"

"$IMAGE_PYTHON" -m export --settings "$SETTINGS" --tokenizer .kit/tokenizer.json > "$OUT/export.log" 2>&1 || { tail -30 "$OUT/export.log"; exit 1; }
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS"
python3 -m loadtest.reliability --settings "$SETTINGS" --users "$USERS" --phase-seconds "$PHASE_SECONDS" --out "$OUT"
