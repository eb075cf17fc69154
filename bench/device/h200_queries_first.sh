#!/usr/bin/env bash
# One device call on the H200 for issue 45: this tree beside others in the same call (TREES: "name:folder" pairs,
# each a plain copy of a commit with its own export, e.g. `git archive 6545040 | tar -x -C .trees/main`, carried).
# The engine alone first (its own figure beside the served ones; SHARED=1: bench.shared_engine after it), then per
# tree, with that tree's own benchmarks:
# - PART=queries: bench.api_cost, one text a request, direct gRPC and /v1/embeddings (base64) at CONCURRENCY: a load
#   of queries only, sent by each of GENERATORS (perf_analyzer: one process, PA_THREADS threads; python: the harness);
# - PART=shapes: bench.e2e_bench (perf_analyzer, unary gRPC) at E2E_SHAPES (texts x concurrency);
# - PART=priority: bench.priority_bench: one-text queries at 50/s alone and beside SHAPES of ingestion
#   (clients x texts), then 1,000 requests with a 5 ms budget beside the first shape, from each count of client
#   processes in DEADLINE_PROCESSES ("1 8" unless set: 64 at a time from one process, then 8 at a time from each of 8).
# ROUNDS: how many times the trees run, alternating (round r > 1 writes <name>-r<r>).
# SET_<name>: --set overrides for that tree (e.g. SET_new="encoder.instances=8"). MPS_<name>=1: that tree's runs
# under an MPS control daemon (its default folders; quit after them), so its stubs' kernels share the GPU at once. API_HEADERS: NAME:VALUE headers
# that PART=queries adds to the HTTP routes' requests (bench.api_cost --header), e.g. "X-Request-Timeout:1s".
# Run from the repo root with .kit and the trees carried. Results land in $OUT.
OUT=${OUT:-/tmp/h200_queries_first}
EXPORT_LOG=/tmp/export.log
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=${SETTINGS:-settings/variants/bert-base-h200.toml}
TREES=${TREES:-new:.}
PART=${PART:-queries}
ROOT=$(pwd)
declare -A exporting=()  # a folder named by several trees (its settings apart) is exported once
for pair in $TREES; do
  name=${pair%%:*} folder=${pair#*:}
  [ -f "$folder/build/models/bert-base-random/model.safetensors" ] || [ -n "${exporting[$folder]:-}" ] && continue
  exporting[$folder]=1
  (cd "$folder" && "$IMAGE_PYTHON" -m export --settings "$SETTINGS" --tokenizer "$ROOT/.kit/tokenizer.json" \
    > "/tmp/export-$name.log" 2>&1 || { tail -20 "/tmp/export-$name.log"; exit 1; }) &
done
wait
if [ "${ENGINE:-1}" = 1 ]; then  # ENGINE=0: a second part in the same call
  "$IMAGE_PYTHON" -m bench.engine_bench --out "$OUT" --no-baseline --batch-sizes "${ENGINE_BATCHES:-1,64,1024}" 2>&1 \
    | grep "^engine"
fi
if [ "${SHARED:-0}" = 1 ]; then  # bench.shared_engine: 8 processes with an engine each, against one engine process
  "$IMAGE_PYTHON" -m bench.shared_engine --out "$OUT/shared" ${SHARED_TEXTS:+--texts $SHARED_TEXTS} 2>&1 \
    | grep -E "^(own|mps|shared) "
fi
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
headers=()  # API_HEADERS, the same for every tree
for item in ${API_HEADERS:-}; do headers+=(--header "$item"); done
for round in $(seq "${ROUNDS:-1}"); do  # ROUNDS > 1: the trees again, alternating (a window spreads 7-10 %)
  for pair in $TREES; do
    name=${pair%%:*} folder=${pair#*:}
    label=$name  # its results: $OUT/<label>-...
    [ "$round" = 1 ] || label=$name-r$round
    set_var="SET_${name}"
    flags=()
    for override in ${!set_var:-}; do flags+=(--set "$override"); done
    echo "== $label ($folder) ${!set_var:-}"
    mps_var="MPS_${name}"
    if [ "${!mps_var:-0}" = 1 ]; then  # the tree's processes inherit the daemon's folders
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "MPS daemon started"
    fi
    (cd "$folder" && python3 -m model_repository.generate --settings "$SETTINGS" "${flags[@]}" > /dev/null)
    if [ "$PART" = queries ]; then
      # perf_analyzer: one process of PA_THREADS threads (16, its own default, as issue 45's figures ran it: with 1
      # thread its OpenAI mode used about 1.2 cores at 14k req/s, docs/results/h100/landing-2026-12-05-c);
      # python: the harness's PY_PROCESSES processes.
      for generator in ${GENERATORS:-perf_analyzer}; do
        processes=${PA_THREADS:-16}
        [ "$generator" = python ] && processes=${PY_PROCESSES:-4}
        echo "-- $generator"
        (cd "$folder" && python3 -m bench.api_cost --settings "$SETTINGS" "${flags[@]}" --generator "$generator" \
          --processes "$processes" --routes grpc api-base64 "${headers[@]}" --concurrency ${CONCURRENCY:-1 64 256} \
          --duration-s "${DURATION_S:-4}" --rounds 1 --out "$OUT/$label-$generator" 2>&1 \
          | tee "$OUT/$label-$generator.log" | grep "^c=") || echo "$name: api_cost failed"
      done
    elif [ "$PART" = shapes ]; then  # several texts a request over unary gRPC: TEXTSxCONCURRENCY
      (cd "$folder" && python3 -m bench.e2e_bench --settings "$SETTINGS" "${flags[@]}" --perf-analyzer "$PERF_ANALYZER" \
        --gpu-name "$GPU_NAME" --shapes "${E2E_SHAPES:-8x64,64x8}" --interval-ms 2000 --out "$OUT/$label-shapes" 2>&1 \
        | tee "$OUT/$label-shapes.log" | grep -v "^ " | tail -6) || echo "$name: e2e_bench failed"
    else
      shapes=${SHAPES:-16x64 4x64 64x8}
      modes=(--modes lanes)  # a tree whose priority_bench runs both modes always: the first shape only
      grep -q -- '"--modes"' "$folder/bench/priority_bench.py" || { modes=(); shapes=${shapes%% *}; }
      for shape in $shapes; do
        deadline=(--deadline-requests 0)
        [ "$shape" = "${shapes%% *}" ] && deadline=(--deadline-requests 1000 --budget-ms 5 \
          --deadline-processes ${DEADLINE_PROCESSES:-1 8})
        (cd "$folder" && python3 -m bench.priority_bench --settings "$SETTINGS" "${flags[@]}" --query-rate 50 \
          --ingestion-clients "${shape%x*}" --ingestion-texts "${shape#*x}" --duration "${DURATION:-8}" "${deadline[@]}" \
          "${modes[@]}" --out "$OUT/$label-$shape" 2>&1 | grep -v "^ " | tail -4) || echo "$name $shape: priority_bench failed"
      done
    fi
    if [ "${!mps_var:-0}" = 1 ]; then
      echo "MPS clients seen: $(grep -ci 'new client' "$CUDA_MPS_LOG_DIRECTORY/control.log" || true)"
      echo quit | nvidia-cuda-mps-control
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  done
done
