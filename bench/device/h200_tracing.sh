#!/usr/bin/env bash
# One device call on the H200: what tracing costs (python -m bench.tracing_cost). The launcher with [tracing]
# off, then on at SAMPLE_RATE towards an OTLP/HTTP receiver in the bench's process, alternating ROUNDS times
# (off, on, off, on), each server driven at CONCURRENCY by /v1/embeddings base64 (one text per request) and by
# direct gRPC for DURATION seconds a route; the receiver's spans counted per phase and service. The bar: at a
# 1 % sample rate tracing costs <= 3 % of the throughput at c=64, and with tracing off nothing is exported.
# About 5-6 minutes on the H200: four starts of ~40-60 s (each while the last server stops), 16 s of load
# each (2 s of warm-up and DURATION a route), the export and the kit's unpacking; within one device call.
# Run from the repo root with .kit carried; EXPORT=0 when the model is exported already. Results land in $OUT
# (tracing_cost.json and .txt, its log and the launchers'). A check on a CPU with a kit built for the local
# Python (KIT_PY=3.11 KIT_DIR=/tmp/kit311 bash bench/make_kit.sh):
#   IMAGE_PYTHON=$PWD/.venv/bin/python KIT_SRC=/tmp/kit311 KIT_ROOT=/tmp/kit311-root SETTINGS=settings/defaults.toml \
#     EXPORT=0 DURATION=2 PROCESSES=1 OUT=/tmp/tracing-check bash bench/device/h200_tracing.sh
OUT=${OUT:-/tmp/h200_tracing}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
if [ "${EXPORT:-1}" = 1 ]; then
  export_model "$SETTINGS"
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS" > /dev/null
# shellcheck disable=SC2086  # TRITON_SPANS: a flag or nothing
python3 -m bench.tracing_cost --settings "$SETTINGS" --concurrency "${CONCURRENCY:-64}" --processes "${PROCESSES:-4}" \
  --duration-s "${DURATION:-6}" --rounds "${ROUNDS:-2}" --sample-rate "${SAMPLE_RATE:-0.01}" --out "$OUT" \
  ${TRITON_SPANS:+--triton-spans} 2>&1 |
  tee "$OUT/tracing_cost.log"
