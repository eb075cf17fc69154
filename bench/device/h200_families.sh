#!/usr/bin/env bash
# Issue 33's H200 figures for every model family, in device calls of one PART each (run from the repo root with
# .kit carried; bench/make_kit.sh builds it):
#   PART=engine  the GPU tests of the engine and of every family (pytest -m gpu), then python -m
#                bench.family_bench: each family at its base size against transformers fp16 (SDPA) at batch 1,
#                64 and 1,024 in the same call, and ModernBERT at 2,048 and 8,192 tokens a sequence.
#   PART=served  each family's settings file with bert-base-h200.toml's serving (torch fp16, one stage, 8
#                instances on GPU 0, 128 tokens) exported (random weights of its real shape) and served one after
#                the other on the real tritonserver, perf_analyzer at SHAPES (python -m bench.e2e_bench), BERT-base
#                first; then the engine alone at batch 64 on each export, the figure beside the served one.
OUT=${OUT:-/tmp/h200_families}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
PART=${PART:-engine}
FAMILIES=${FAMILIES:-bert-base roberta xlm-roberta distilbert mpnet modernbert}
SHAPES=${SHAPES:-1x256}

if [ "$PART" = engine ]; then
  "$IMAGE_PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/model/test_engine_torch.py tests/model/test_model_*.py \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -25 || true  # the benchmark runs whatever the tests say
  "$IMAGE_PYTHON" -m bench.family_bench --out "$OUT" ${PRESETS:+--presets "$PRESETS"} 2>&1 | tee "$OUT/family_bench.log"
  exit 0
fi

# One settings file per family: bert-base-h200.toml with the family's source and name.
settings=()
for family in $FAMILIES; do
  file=/tmp/$family-h200.toml
  if [ "$family" = bert-base ]; then
    cp settings/variants/bert-base-h200.toml "$file"
  else
    source_line=$(grep '^source' "settings/variants/$family.toml")
    sed -e "s|^source = .*|$source_line|" -e "s|^name = .*|name = \"$family-h200\"|" \
      settings/variants/bert-base-h200.toml > "$file"
  fi
  tokenizer=()
  [ "$family" = bert-base ] || [ "$family" = distilbert ] && tokenizer=(--tokenizer .kit/tokenizer.json)
  "$IMAGE_PYTHON" -m export --settings "$file" "${tokenizer[@]}" > "$OUT/export-$family.log" 2>&1 || {
    tail -20 "$OUT/export-$family.log"
    continue
  }
  settings+=(--settings "$file")
done

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m bench.e2e_bench "${settings[@]}" --perf-analyzer "$PERF_ANALYZER" --gpu-name "$GPU_NAME" --warmup-s 5 \
  --interval-ms "${INTERVAL_MS:-2000}" --shapes "$SHAPES" --out "$OUT" 2>&1 | tee "$OUT/e2e_bench.log" | tail -30
python3 - "${settings[@]}" <<'EOF' | tee "$OUT/engine.txt"
import sys
from bench.perf_check import engine_batches, engine_rate
from loadtest.corpus import load_text
from settings import load_settings
for path in sys.argv[2::2]:
    settings = load_settings(path)
    engine, batches = engine_batches(settings, load_text()[:2048], 64)
    print(f"{settings.model.name}: engine alone, batch 64: {engine_rate(engine, batches):,.0f} texts/s")
    del engine
EOF
