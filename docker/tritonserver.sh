#!/bin/sh
# The server image sets TRITONSERVER_BIN to this file. The launcher (python3 -m serving.launcher)
# execs it with its own flags; it execs the real tritonserver with those flags followed by
# TRITONSERVER_EXTRA_ARGS (whitespace-separated; a flag given again there wins, Triton takes the last one).
# The image's default turns on latency summaries (p50/p90/p99 per model) for the dashboard.
set -eu
# shellcheck disable=SC2086  # splitting TRITONSERVER_EXTRA_ARGS into flags is the point
exec "${TRITONSERVER_REAL_BIN:-/opt/tritonserver/bin/tritonserver}" "$@" ${TRITONSERVER_EXTRA_ARGS:-}
