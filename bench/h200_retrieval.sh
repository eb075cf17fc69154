#!/usr/bin/env bash
# Issue 34's retrieval figures on one H200, in one device call (run from the repo root with .kit and .devwheels
# carried; bench/make_kit.sh builds .kit):
#   hybrid   python -m bench.hybrid_bench on CUDA: BGE-M3 (random weights, XLM-RoBERTa-large's shape) on the torch
#            engine fp16, all three outputs against the dense vector alone, at BATCHES. No --tokenizer: XLM-R's
#            tokenizer is trained at export.
#   colbert  python -m bench.multi_vector_bench on CUDA: ColBERT (random weights of bert-base's shape, MiniLM's
#            vocabulary from .kit/tokenizer.json) on the torch engine fp16 against sentence-transformers'
#            MultiVectorEncoder fp16 (PyLate's stand-in), documents and queries, at BATCHES. Where the image's
#            sentence-transformers has no MultiVectorEncoder, .devwheels/*.whl goes to /tmp/st first.
#   PARTS="hybrid colbert" (default) picks the steps; one failing does not stop the other.
OUT=${OUT:-/tmp/h200_retrieval}
# shellcheck source=bench/device_preamble.sh
source bench/device_preamble.sh
PARTS=${PARTS:-hybrid colbert}
BATCHES=${BATCHES:-64,1,256}
TEXTS=${TEXTS:-1024}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/machine.txt"

case " $PARTS " in *" hybrid "*)
  "$IMAGE_PYTHON" -m bench.hybrid_bench --device cuda --preset bge-m3 --batch "$BATCHES" --texts "$TEXTS" \
    --out "$OUT" 2>&1 | tee "$OUT/hybrid.log" | tail -20 || echo "hybrid_bench failed"  # colbert runs regardless
  ;;
esac

case " $PARTS " in *" colbert "*)
  # MultiVectorEncoder (sentence-transformers >= 6); the image's own first, else the carried wheel.
  if ! "$IMAGE_PYTHON" -c 'from sentence_transformers import MultiVectorEncoder' > /tmp/st_import.log 2>&1; then
    echo "image's sentence_transformers has no MultiVectorEncoder: $(tail -n 1 /tmp/st_import.log)"
    "$IMAGE_PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      --target /tmp/st .devwheels/*.whl
    export PYTHONPATH=/tmp/st${PYTHONPATH:+:$PYTHONPATH}
    "$IMAGE_PYTHON" -c 'from sentence_transformers import MultiVectorEncoder' > /tmp/st_import.log 2>&1 || {
      echo "MultiVectorEncoder from the wheel fails too:"
      tail -n 20 /tmp/st_import.log
    }
  fi
  "$IMAGE_PYTHON" -c 'import sentence_transformers as s, transformers as t, torch; print("sentence_transformers",
s.__version__, s.__file__, "transformers", t.__version__, "torch", torch.__version__)' | tee -a "$OUT/machine.txt" || true
  "$IMAGE_PYTHON" -m bench.multi_vector_bench --device cuda --shape bert-base --batch "$BATCHES" --texts "$TEXTS" \
    --tokenizer .kit/tokenizer.json --side both --out "$OUT" 2>&1 | tee "$OUT/colbert.log" | tail -20 ||
    echo "multi_vector_bench failed"
  ;;
esac
