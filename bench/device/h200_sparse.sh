#!/usr/bin/env bash
# Issue 34's SPLADE (task sparse) figures on one H200, in one device call (run from the repo root with .kit and
# .devwheels carried; bench/make_kit.sh builds .kit):
#   A. python -m bench.sparse_bench on CUDA: the torch engine alone against sentence-transformers' SparseEncoder
#      fp16 at BATCHES, in one process (texts/s, peak GPU memory, agreement, the whole logits' size).
#      Where the image's sentence-transformers has no SparseEncoder, .devwheels/*.whl goes to /tmp/st first.
#   B. settings/variants/splade.toml's model (random weights of bert-base's shape, MiniLM's vocabulary) with
#      bert-base-h200.toml's serving (torch at the task's own precision, fp32; one stage, its instances on GPU 0),
#      exported and served on the real tritonserver, perf_analyzer at SHAPES (python -m bench.e2e_bench); then the
#      engine alone at batch 64 on that export, in the same call.
#   PARTS="A B" (default) picks the steps.
OUT=${OUT:-/tmp/h200_sparse}
EXPORT_LOG=/tmp/export-splade.log  # not in $OUT: the device tool brings back at most 8 files
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
PARTS=${PARTS:-A B}
BATCHES=${BATCHES:-64,256,1}
SHAPES=${SHAPES:-1x256,64x8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/machine.txt"

case " $PARTS " in *" A "*)
  sentence_transformers_with SparseEncoder
  "$IMAGE_PYTHON" -m bench.sparse_bench --device cuda --tokenizer .kit/tokenizer.json --batch "$BATCHES" \
    --texts "${TEXTS:-1024}" --passes 3 --out "$OUT" 2>&1 | tee /tmp/sparse_bench.log | tail -20 ||
    echo "sparse_bench failed"  # part B runs regardless
  ;;
esac

case " $PARTS " in *" B "*)
  # bert-base-h200.toml's serving with splade.toml's [model] section in place of its own, and the task's own
  # precision (auto: fp32, the one whose term sets match SparseEncoder fp32) in place of the variant's fp16.
  settings=/tmp/splade-h200.toml
  {
    echo "# bench/device/h200_sparse.sh: settings/variants/splade.toml's [model] with bert-base-h200.toml's serving."
    sed -n '/^\[model\]/,/^$/p' settings/variants/splade.toml
    echo
    sed -e '/^\[model\]/,/^$/d' -e '1,/^$/d' -e '/^precision *=/d' settings/variants/bert-base-h200.toml
  } > "$settings"
  cp "$settings" "$OUT/splade-h200.toml"
  "$IMAGE_PYTHON" -c 'import sys; from settings import load_settings; s = load_settings(sys.argv[1]);
print("settings:", s.model.name, s.model.task, s.model.max_tokens, s.engine.kind, s.engine.precision, s.topology,
      "instances", s.encoder.instances, "gpus", s.encoder.gpus)' "$settings"
  export_model "$settings"

  # shellcheck source=bench/device_env.sh
  source bench/device_env.sh
  python3 -m bench.e2e_bench --settings "$settings" --perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" \
    --warmup-s 5 --interval-ms "${INTERVAL_MS:-2000}" --shapes "$SHAPES" --out "$OUT" 2>&1 |
    tee /tmp/e2e_bench.log | tail -30 || echo "e2e_bench failed"
  python3 - "$settings" <<'EOF' 2>&1 | tee "$OUT/engine.txt" || true
import sys
import torch
from bench.perf_check import engine_batches, engine_rate
from loadtest.corpus import load_text
from settings import load_settings
settings = load_settings(sys.argv[1])
engine, batches = engine_batches(settings, load_text()[:2048], 64)
torch.cuda.reset_peak_memory_stats()
rate = engine_rate(engine, batches)
peak = torch.cuda.max_memory_allocated() / 2**20
print(f"{settings.model.name}: engine alone, batch 64: {rate:,.0f} texts/s (peak allocated {peak:,.0f} MiB)")
EOF
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/engine.txt" 2>/dev/null || true
  ;;
esac
tail -n 40 /tmp/sparse_bench.log /tmp/e2e_bench.log > "$OUT/logs.txt" 2>/dev/null || true
