#!/usr/bin/env bash
# One device call on the H200: an embedder and a reranker, BERT-base sizes (random weights), served alone and
# together (python -m bench.several_models), the torch engine's cross-encoder GPU test, and the stop of a GPU
# server: SIGTERM to the launcher after a load, with STOP_INSTANCES instances (each run with a generous
# exit timeout, so that its log says how long the drain and tritonserver's unload take). Run from the repo
# root with .kit carried; results land in $OUT.
OUT=${OUT:-/tmp/h200_several_models}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
EMBEDDER=settings/variants/bert-base-h200.toml
RERANKER=settings/variants/reranker-bert-base-h200.toml
SHAPES=${SHAPES:---shape 1x256 --shape 32x16}
STOP_INSTANCES=${STOP_INSTANCES:-8 16}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$EMBEDDER"
  export_model "$RERANKER"
fi
("$IMAGE_PYTHON" -m pytest -q -m gpu tests/model/test_engine_torch.py -k cross_encoder -p no:cacheprovider -s || true) \
  2>&1 | tail -30 | tee "$OUT/test-gpu.log"

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
# shellcheck disable=SC2086
python3 -m bench.several_models --settings "$EMBEDDER" "$RERANKER" $SHAPES --perf-analyzer "$PERF_ANALYZER" \
  --out "$OUT" 2>&1 | tee "$OUT/several_models.log"

# The stop after a load, with a generous exit timeout, so that the log says how long each step takes.
OUT=$OUT EXPORT=0 SERVER_SETTINGS="exit_timeout_s = 60" SETTINGS=$EMBEDDER STOP_INSTANCES=$STOP_INSTANCES bash bench/device/h200_stop.sh
