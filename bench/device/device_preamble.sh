# shellcheck shell=bash
# The start every device script shares; source it from the repo root once OUT has its default:
# strict mode, unbuffered Python, $OUT, the image's Python, one line naming the GPU and the host, and
# `export_model SETTINGS`: the export in the image's own Python (numpy 2), its log in $EXPORT_LOG.
set -euo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

# The device sends back at most 8 files of its $OUT, none more than two folders down, and drops the rest (a call
# of 2026-12-07 lost four trees' records so). On exit, more files than that, or any two folders down in $OUT (which
# may itself be a folder of the device's), become one archive, $OUT/out-<time>.tar.gz; an earlier script's archive
# in the same $OUT stays as it is.
pack_out() {
  local files archive
  files=$(find "$OUT" -type f ! -name 'out-*.tar.gz' | wc -l)
  [ "$files" -gt 8 ] || [ -n "$(find "$OUT" -mindepth 3 -type f | head -n 1)" ] || return 0
  archive=out-$(date -u +%H%M%S).tar.gz
  tar -C "$OUT" --exclude './out-*.tar.gz' -czf "/tmp/$archive" . \
    && find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'out-*.tar.gz' -exec rm -rf {} + \
    && mv "/tmp/$archive" "$OUT/$archive" && echo "packed $files files of $OUT into $OUT/$archive"
}
trap pack_out EXIT
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

# `wait_ready URL PID LOG [SECONDS]`: wait until URL answers (200); fail, with LOG's tail, when process PID ends
# first or after SECONDS (300).
wait_ready() {
  local url=$1 pid=$2 log=$3 limit=${4:-300} polls=0
  until python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)' "$url" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { tail -40 "$log"; return 1; }
    [ "$polls" -lt $((limit * 2)) ] || { echo "not ready after $limit s: $url"; tail -40 "$log"; return 1; }
    sleep 0.5
    polls=$((polls + 1))
  done
}

# `sentence_transformers_with CLASS`: the image's sentence-transformers where it has CLASS (SparseEncoder,
# MultiVectorEncoder), else the carried .devwheels/*.whl installed into /tmp/st, first on PYTHONPATH; the versions
# in use are appended to $OUT/machine.txt.
sentence_transformers_with() {
  if ! "$IMAGE_PYTHON" -c "from sentence_transformers import $1" > /tmp/st_import.log 2>&1; then
    echo "image's sentence_transformers has no $1: $(tail -n 1 /tmp/st_import.log)"
    "$IMAGE_PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      --target /tmp/st .devwheels/*.whl
    export PYTHONPATH=/tmp/st${PYTHONPATH:+:$PYTHONPATH}
    "$IMAGE_PYTHON" -c "from sentence_transformers import $1" > /tmp/st_import.log 2>&1 || {
      echo "$1 from the wheel fails too:"
      tail -n 20 /tmp/st_import.log
    }
  fi
  "$IMAGE_PYTHON" -c 'import sentence_transformers as s, transformers as t, torch; print("sentence_transformers",
s.__version__, s.__file__, "transformers", t.__version__, "torch", torch.__version__)' | tee -a "$OUT/machine.txt" || true
}
