# A/B: the API worker's gRPC client on grpcio's default EventEngine client ("default") or the legacy poller
# ("legacy": GRPC_EXPERIMENTS=-event_engine_client set in serving/api/__main__.py by setdefault). Same tree.
cd /tmp/abtree; source .venv/bin/activate; export PYTHONPATH=/tmp/abtree
export PERF_ANALYZER=/tmp/pa/perf_analyzer
cat > serving/api/__main__.py <<'PY'
"""python -m serving.api: the API front; serving/api/app.py has its routes and options."""
import os

os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")
open(f"/tmp/eeprobe/marker-{os.getpid()}", "w").write(repr(os.environ["GRPC_EXPERIMENTS"]))

from serving.api.app import main

main()
PY
run() {  # arm generator round
  if [ $1 = default ]; then export GRPC_EXPERIMENTS=""; else unset GRPC_EXPERIMENTS; fi
  timeout 300 python -m bench.api_cost --settings /tmp/tiny/tiny.toml --generator $2 --routes grpc api-base64 \
    --concurrency 1 64 --duration-s 5 --rounds 1 --out /tmp/eeprobe/ab/$1-$2-$3 > /tmp/eeprobe/ab/$1-$2-$3.log 2>&1
  unset GRPC_EXPERIMENTS
}
mkdir -p /tmp/eeprobe/ab
for r in 1 2 3; do
  run legacy perf_analyzer $r; run default perf_analyzer $r; run default python $r; run legacy python $r
done
git -C /work/main show HEAD:serving/api/__main__.py > serving/api/__main__.py
echo done
