#!/usr/bin/env bash
# One device call on the H200: python -m loadtest.reliability against the GPU ensemble
# (settings/variants/bert-base-h200.toml): stub kills of the tokenizer and the GPU encoder and a launcher restart
# under a closed-loop load, every request counted. Run from the repo root with .kit carried.
OUT=${OUT:-/tmp/h200_reliability}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
USERS=${USERS:-64}
PHASE_SECONDS=${PHASE_SECONDS:-10}
export_model "$SETTINGS"
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS"
python3 -m loadtest.reliability --settings "$SETTINGS" --users "$USERS" --phase-seconds "$PHASE_SECONDS" --out "$OUT"
