# A/B on 2 cores: the torch CPU engine with one thread for calls under 128 tokens (/work/main, uncommitted, its
# repository generated into /tmp/b-new) against main 0ddcb4e (/tmp/wtmain, into /tmp/b-main); default settings
# (MiniLM, torch bf16 on this CPU), one text a request, alternating rounds.
export PERF_ANALYZER=/tmp/pa/perf_analyzer
run() {  # arm generator round
  dir=/work/main; [ $1 = main ] && dir=/tmp/wtmain
  (cd $dir && timeout 400 /work/main/.venv/bin/python -m bench.api_cost --generator $2 --routes grpc api-base64 \
    --concurrency 1 64 --duration-s 5 --rounds 1 --set "server.build_dir=\"/tmp/b-$1\"" --out /tmp/ab2/$1-$2-$3 \
    > /tmp/ab2/$1-$2-$3.log 2>&1)
}
for r in 1 2; do
  run new perf_analyzer $r; run main perf_analyzer $r; run main python $r; run new python $r
done
echo done > /tmp/ab2/finished
