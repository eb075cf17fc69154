"""Engine `onnxruntime_cpu`: the exported ONNX model (pooling and head included) on ONNX Runtime's CPU provider.

Sequences are sorted by length and run in chunks padded only to the chunk's longest sequence, so a batch
of mixed lengths spends little work on padding; rows are returned in the caller's order.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from engine import Engine
from padding import pad_sequences

# Upper bound on padded tokens per ONNX Runtime call: large enough to amortize call overhead, small
# enough to keep activations in cache on a small CPU.
TOKENS_PER_CHUNK = 4096


class OnnxRuntimeCpuEngine(Engine):
    def __init__(self, model_dir, spec, device, options) -> None:
        super().__init__(model_dir, spec, device, options)
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.intra_op_num_threads = int(options.get("threads", 0))
        session_options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(self.model_dir / "model.onnx"), session_options, providers=["CPUExecutionProvider"]
        )

    def forward(self, sequences: list[np.ndarray]) -> np.ndarray:
        out = np.empty((len(sequences), self.spec.output_size), dtype=np.float32)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        start = 0
        while start < len(order):
            stop = start + 1
            # Grow the chunk while the padded size (rows x longest) stays under the token budget.
            while stop < len(order) and (stop - start + 1) * len(sequences[order[stop]]) <= TOKENS_PER_CHUNK:
                stop += 1
            chunk = order[start:stop]
            ids, mask = pad_sequences([sequences[index] for index in chunk], self.spec.pad_token_id)
            (result,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask})
            out[chunk] = result
            start = stop
        return out


ENGINE = OnnxRuntimeCpuEngine
