#!/bin/bash
# tree_cost.sh REV [ROUNDS]: the API worker's CPU per /v1 request in commit REV's own tree (a plain `git archive`
# copy with its own export and repository of a random bert-tiny, so that the 2 cores go to the front, not the
# engine): bench.api_cost, one text a request, c=64, the harness in one process, ROUNDS rounds of 8 s.
# Prints (requests/s, API workers' us per request, texts per Triton call) for each round.
rev=$1 d=/tmp/tree-$1 s=/tmp/treeset-$1
py=${PYTHON:-/work/main/.venv/bin/python}
if [ ! -d "$d" ]; then
  mkdir -p "$d" "$s"
  git -C /work/main archive "$rev" | tar -x -C "$d"
  printf '[model]\nsource = "random-init:bert-tiny"\nname = "bert-tiny"\n\n[server]\nbuild_dir = "%s/build"\n' "$s" \
    > "$s/tiny.toml"
  (cd "$d" && PYTHONPATH=$d $py -m export --settings "$s/tiny.toml" > "$s/export.log" 2>&1 &&
    PYTHONPATH=$d $py -m model_repository.generate --settings "$s/tiny.toml" > /dev/null) ||
    { echo "setup failed: $rev"; tail -5 "$s/export.log"; exit 1; }
fi
(cd "$d" && PYTHONPATH=$d timeout 300 $py -m bench.api_cost --settings "$s/tiny.toml" --routes api-base64 \
  --concurrency 64 --duration-s 8 --rounds "${2:-2}" --generator python --processes 1 --out "/tmp/cost-$rev" \
  > "/tmp/cost-$rev.log" 2>&1) || { echo "run failed: $rev"; tail -5 "/tmp/cost-$rev.log"; exit 1; }
$py - "$rev" <<'EOF'
import json
import sys

rev = sys.argv[1]
for runs in json.load(open(f"/tmp/cost-{rev}/api_cost.json"))["results"]["c=64"]["runs"].values():
    print(rev, [(r["rps"], round(r["cpu_us_per_request"]["api workers"], 1), r["texts_per_triton_request"]) for r in runs])
EOF
