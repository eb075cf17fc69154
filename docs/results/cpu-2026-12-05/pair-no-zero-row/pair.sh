set -u
R=/tmp/cpupair2; mkdir -p $R
run() { # tree name gen round
  local tree=$1 name=$2 gen=$3 round=$4
  (cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python -m bench.api_cost --concurrency 64 --routes grpc api-base64 \
     --duration-s 8 --rounds 2 --generator $gen --perf-analyzer /tmp/pa/perf_analyzer --processes $5 \
     --out $R/$gen-$name-$round 2>&1 | grep "^c=" | sed "s/^/$gen $name $round: /")
}
for round in ${ROUNDS:-1 2}; do
  if [ $((round % 2)) = 1 ]; then order="main:/tmp/wtd this:/work/main"; else order="this:/work/main main:/tmp/wtd"; fi
  for gen in perf_analyzer python; do
    p=16; [ $gen = python ] && p=1
    for pair in $order; do run ${pair#*:} ${pair%%:*} $gen $round $p; done
  done
done
