"""Engine `onnxruntime_cpu`: the exported ONNX model (pooling and head included) on ONNX Runtime's CPU provider.

ONNX Runtime needs rectangular [batch, sequence] inputs, so sequences are sorted by length and split into
chunks, each padded to its own longest sequence (padding.plan_chunks), so a ragged batch spends little work
on padding.

A sparse model's graph stops at each token's MLM-transformed state (the export's SparseStates): the vocabulary
projection and SpladePooling run here in numpy, a chunk of the vocabulary at a time (sparse.NumpySparseHead), so
no [tokens x vocabulary] tensor is ever whole, in ONNX Runtime's arena or here. A multi-vector model's graph gives
every token's projected vector, and the engine answers them packed (multi_vector_output.py picks the kept ones).
A hybrid model's graph gives each text's dense vector and every token's lexical weight and colbert vector: the
engine answers them as HybridRows, the tokens' packed.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from common.contract import HYBRID_GRAPH_OUTPUTS, TOKEN_TYPES
from common.padding import pad_packed, plan_chunks

from .base import Engine
from .hybrid import HybridRows, colbert_tokens
from .sparse import NumpySparseHead, SparseRows


class OnnxRuntimeCpuEngine(Engine):
    kind = "onnxruntime_cpu"

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
        self.head = NumpySparseHead(self.model_dir, spec.activation) if spec.task == "sparse" else None

    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
                       wanted: frozenset[str] | None = None, kept: np.ndarray | None = None):  # fmt: skip
        if self.spec.task == "multi_vector":
            vectors = self._token_vectors(ids, lengths, types)
            return vectors if kept is None else vectors[kept]
        if self.spec.task == "hybrid":
            return self._hybrid(ids, lengths, HYBRID_GRAPH_OUTPUTS if wanted is None else wanted)
        out = [None] * len(lengths) if self.head else np.empty((len(lengths), self.spec.output_size), np.float32)
        for chunk, real, (result,) in self._chunk_runs(ids, lengths, types):
            if self.head is None:
                out[chunk] = result
                continue
            for row, sparse in zip(chunk, self.head(result[real], lengths[chunk]), strict=True):
                out[row] = sparse
        return SparseRows.joined(out) if self.head else out  # the chunks ran in length order

    def _token_vectors(self, ids: np.ndarray, lengths: np.ndarray, attended: np.ndarray) -> np.ndarray:
        """Every token's vector, packed [tokens, dim]; attended (1/0 per token) is the graph's attention mask, so
        that a query's unattended expansion tokens are keys to none but still get their vector."""
        out = np.empty((len(ids), self.spec.output_size), np.float32)
        starts = np.cumsum(lengths) - lengths
        for chunk, real, (result,) in self._chunk_runs(ids, lengths, attended=attended):
            out[self._places(starts, chunk, real)] = result[real]
        return out

    def _hybrid(self, ids: np.ndarray, lengths: np.ndarray, wanted) -> HybridRows:
        """The graph gives all three; only the wanted ones are gathered out of its padded outputs."""
        shapes = (len(lengths), self.spec.output_size), (len(ids),), (len(ids), self.spec.hybrid["colbert_size"])
        out = [np.empty(shape, np.float32) if name in wanted else None for name, shape in
               zip(HYBRID_GRAPH_OUTPUTS, shapes, strict=True)]  # fmt: skip
        starts = np.cumsum(lengths) - lengths
        for chunk, real, results in self._chunk_runs(ids, lengths):
            places = self._places(starts, chunk, real)
            for whole, result, per_token in zip(out, results, (False, True, True), strict=True):
                if whole is not None:
                    whole[places if per_token else chunk] = result[real] if per_token else result
        if out[2] is not None:
            out[2] = out[2][colbert_tokens(lengths)]
        return HybridRows(*out)

    @staticmethod
    def _places(starts: np.ndarray, chunk: np.ndarray, real: np.ndarray) -> np.ndarray:
        """Where the chunk's real tokens go in the packed layout, in the order real[real] reads them."""
        return (starts[chunk][:, None] + np.arange(real.shape[1])[None, :])[real]

    def _chunk_runs(
        self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None, attended: np.ndarray | None = None
    ):
        """The graph run on each chunk of similar lengths (plan_chunks): (the chunk's rows, where its padded
        tokens are real, the graph's outputs). attended: the attention mask per token in place of the real tokens'
        (a multi-vector query's expansion)."""
        starts = np.cumsum(lengths) - lengths
        order = np.argsort(lengths, kind="stable")
        self.computed_tokens = 0
        for start, stop in plan_chunks(lengths[order]):
            chunk = order[start:stop]
            padded, real = pad_packed(ids, lengths[chunk], self.spec.pad_token_id, starts=starts[chunk])
            mask = real if attended is None else pad_packed(attended, lengths[chunk], 0, starts=starts[chunk])[0]
            feeds = {"input_ids": padded, "attention_mask": mask}
            if TOKEN_TYPES in self.spec.engine_inputs:
                feeds[TOKEN_TYPES] = pad_packed(types, lengths[chunk], 0, starts=starts[chunk])[0]
            self.computed_tokens += padded.size
            yield chunk, real.astype(bool), self.session.run(None, feeds)
