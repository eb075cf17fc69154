# 1 and 8 texts a request over direct gRPC: main's default (a stub per instance calling its engine) against
# engine.options={shared_process=true}, alternating, perf_analyzer 2.51 in one process, MiniLM on onnxruntime_cpu,
# two encoder instances (so that there are stubs to share the process).
cd /work/main
export LD_LIBRARY_PATH=/tmp/pa/lib:${LD_LIBRARY_PATH:-}
run() {  # name round overrides...
  name=$1 round=$2; shift 2
  timeout 600 .venv/bin/python -m bench.e2e_bench --perf-analyzer /tmp/pa/perf_analyzer --set encoder.instances=2 "$@" \
    --shapes 1x16,8x8 --interval-ms 5000 --stability 25 --out /tmp/shared_cpu/$name-$round > /tmp/shared_cpu/$name-$round.log 2>&1 || echo "$name $round failed"
  grep -E "texts/s" /tmp/shared_cpu/$name-$round.log | tail -2
}
for r in 1 2; do
  run own $r
  run shared $r --set 'engine.options={shared_process=true}'
done
echo done
