# The CPU default (one encoder instance, its own engine) against two instances sharing one engine process
# (engine.options={shared_process=true}), alternating, perf_analyzer 2.51 in one process, MiniLM, engine auto.
cd /work/main
export LD_LIBRARY_PATH=/tmp/pa/lib:${LD_LIBRARY_PATH:-}
run() {  # name round overrides...
  name=$1 round=$2; shift 2
  timeout 600 .venv/bin/python -m bench.e2e_bench --perf-analyzer /tmp/pa/perf_analyzer "$@" \
    --shapes 1x16,8x8 --interval-ms 5000 --stability 25 --out /tmp/shared_cpu/$name-$round > /tmp/shared_cpu/$name-$round.log 2>&1 || echo "$name $round failed"
  grep -E "texts/s" /tmp/shared_cpu/$name-$round.log | tail -2 | sed "s/^/$name $round /"
}
for r in 1 2; do
  run default $r
  run shared2 $r --set encoder.instances=2 --set 'engine.options={shared_process=true}'
done
echo done
