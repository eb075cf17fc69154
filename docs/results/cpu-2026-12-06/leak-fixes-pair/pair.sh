cd /work/main; source .venv/bin/activate
export PERF_ANALYZER=/tmp/pa/perf_analyzer
run() {  # tree generator
  dir=/work/main; [ "$1" = prev ] && dir=/tmp/prev_tree
  (cd $dir && PYTHONPATH=$dir timeout 300 python -m bench.api_cost --settings /tmp/tiny/tiny.toml --generator $2 --routes grpc api-base64 --concurrency 1 64 --duration-s 4 --rounds 1 --out /tmp/apipair2/$1-$2-$3 > /tmp/apipair2/$1-$2-$3.log 2>&1)
  echo "$1 $2 $(date -u +%T) $(grep '^c=' /tmp/apipair2/$1-$2-$3.log | tr '\n' ' ')" >> /tmp/apipair2/summary.txt
}
run prev perf_analyzer 1; run new perf_analyzer 1; run new python 1; run prev python 1
run new perf_analyzer 2; run prev perf_analyzer 2; run prev python 2; run new python 2
