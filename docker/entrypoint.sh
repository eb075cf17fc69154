#!/usr/bin/env bash
# The server image's entrypoint: NVIDIA's where the base has it (NGC images: it sets up CUDA forward
# compatibility on older data-center drivers, then execs the rest), else the command itself (the local base).
set -euo pipefail
if [[ -x /opt/nvidia/nvidia_entrypoint.sh ]]; then
    exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
