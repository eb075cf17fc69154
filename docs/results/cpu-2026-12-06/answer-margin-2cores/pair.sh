set -e
run() { # tree name
  (cd $1 && /work/main/.venv/bin/python -m model_repository.generate --settings /tmp/tiny/tiny.toml > /dev/null && \
   /work/main/.venv/bin/python -m bench.priority_bench --settings /tmp/tiny/tiny.toml --query-rate 20 --ingestion-clients 2 \
     --ingestion-texts 64 --duration 4 --deadline-requests 400 --budget-ms $BUDGET --deadline-processes 1 --modes lanes \
     --out /tmp/gp/pair/b$BUDGET-$2 2>&1 | tail -1 > /dev/null)
  python3 -c "
import json; d=json.load(open('/tmp/gp/pair/b$BUDGET-$2/priority_bench.json'))['modes']['lanes']['deadlines']
print('$2', {k: d[k] for k in ('answered_200','answered_504','refused_by_stage','rows_run_unanswered','p50_ms','max_ms','within_bound')})"
}
for i in 1 2; do run /work/main main$i; run /tmp/wt-margin margin$i; done
