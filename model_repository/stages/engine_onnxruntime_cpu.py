"""Engine `onnxruntime_cpu`: the exported ONNX model (pooling and head included) on ONNX Runtime's CPU provider.

ONNX Runtime needs rectangular [batch, sequence] inputs, so sequences are sorted by length and split into
chunks, each padded to its own longest sequence. Where to cut is chosen by dynamic programming to
minimize padded tokens plus a per-call cost, so a ragged batch spends little work on padding.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from engine import Engine
from padding import pad_packed

# What one ONNX Runtime call costs beyond its tokens, in token equivalents (measured order of magnitude on
# MiniLM: ~1 ms of fixed work per call at ~20-40 us per token).
CALL_COST_TOKENS = 32
# Largest padded chunk, to bound activation memory.
MAX_CHUNK_TOKENS = 16384


def plan_chunks(lengths: np.ndarray) -> list[tuple[int, int]]:
    """Cut ascending lengths into [start, stop) chunks minimizing sum(CALL_COST + rows * longest)."""
    count = len(lengths)
    best = np.zeros(count + 1)
    cut = np.zeros(count + 1, dtype=np.int64)
    for stop in range(1, count + 1):
        starts = np.arange(stop)
        padded = (stop - starts) * lengths[stop - 1]
        cost = best[:stop] + CALL_COST_TOKENS + np.where(padded <= MAX_CHUNK_TOKENS, padded, np.inf)
        cost[stop - 1] = best[stop - 1] + CALL_COST_TOKENS + lengths[stop - 1]  # a single row always fits
        cut[stop] = int(np.argmin(cost))
        best[stop] = cost[cut[stop]]
    chunks, stop = [], count
    while stop > 0:
        chunks.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return chunks[::-1]


class OnnxRuntimeCpuEngine(Engine):
    def __init__(self, model_dir, spec, device, options) -> None:
        super().__init__(model_dir, spec, device, options)
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.intra_op_num_threads = int(options.get("threads", 0))
        session_options.inter_op_num_threads = 1
        # Spinning worker threads would steal the cores the tokenizer and the server need between calls.
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(self.model_dir / "model.onnx"), session_options, providers=["CPUExecutionProvider"]
        )

    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        out = np.empty((len(lengths), self.spec.output_size), dtype=np.float32)
        starts = np.cumsum(lengths) - lengths
        order = np.argsort(lengths, kind="stable")
        self.computed_tokens = 0
        for start, stop in plan_chunks(lengths[order]):
            chunk = order[start:stop]
            padded, mask = pad_packed(ids, lengths[chunk], self.spec.pad_token_id, starts=starts[chunk])
            self.computed_tokens += padded.size
            (result,) = self.session.run(None, {"input_ids": padded, "attention_mask": mask})
            out[chunk] = result
        return out


ENGINE = OnnxRuntimeCpuEngine
