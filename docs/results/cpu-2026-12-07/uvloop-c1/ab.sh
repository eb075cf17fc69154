# A/B: the API worker's event loop, asyncio's default (main) or uvloop 0.23.0 (API_LOOP=uvloop, a probe-only line in
# /tmp/abtree/serving/api/app.py). Same tree (HEAD), tiny model, both generators, c=1 and 64, alternating rounds.
cd /tmp/abtree; source .venv/bin/activate; export PYTHONPATH=/tmp/abtree:/tmp/uvlib
export PERF_ANALYZER=/tmp/pa/perf_analyzer
run() {  # arm generator round
  if [ $1 = uvloop ]; then export API_LOOP=uvloop; else unset API_LOOP; fi
  (sleep 25; for f in /tmp/uvprobe/marker-*; do pid=${f##*-}; [ -d /proc/$pid ] && echo "$pid $(cat $f) \
    $(grep -c uvloop /proc/$pid/maps)"; done > /tmp/uvprobe/ab/$1-$2-$3.maps) &
  timeout 300 python -m bench.api_cost --settings /tmp/tiny/tiny.toml --generator $2 --routes grpc api-base64 \
    --concurrency 1 64 --duration-s 5 --rounds 1 --out /tmp/uvprobe/ab/$1-$2-$3 > /tmp/uvprobe/ab/$1-$2-$3.log 2>&1
  unset API_LOOP
}
mkdir -p /tmp/uvprobe/ab
for r in 1 2 3; do
  run uvloop perf_analyzer $r; run asyncio perf_analyzer $r; run asyncio python $r; run uvloop python $r
done
echo done
