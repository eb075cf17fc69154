# shellcheck shell=bash
# The start every device script shares; source it from the repo root once OUT has its default:
# strict mode, unbuffered Python, $OUT, the image's Python, one line naming the GPU and the host, and
# `export_model SETTINGS`: the export in the image's own Python (numpy 2), its log in $EXPORT_LOG.
set -euo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
IMAGE_PYTHON=${IMAGE_PYTHON:-/opt/torch/.venv/bin/python3}
EXPORT_LOG=${EXPORT_LOG:-$OUT/export.log}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
echo "GPU: $GPU_NAME, $(nproc) cores, $(date -u +%FT%TZ)"

export_model() {
  "$IMAGE_PYTHON" -m export --settings "$1" --tokenizer .kit/tokenizer.json > "$EXPORT_LOG" 2>&1 || {
    tail -30 "$EXPORT_LOG"
    return 1
  }
  tail -2 "$EXPORT_LOG"
}
