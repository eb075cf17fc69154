"""The torch engine's sparse head (task sparse: SPLADE, OpenSearch's neural-sparse doc models): the checkpoint's MLM
head and sentence-transformers' SpladePooling on the packed token stream, without the [tokens x vocabulary] logits.

Every token's state goes through the MLM transform (dense, activation, LayerNorm); then the decoder (tied to the
word embeddings) runs a chunk of the vocabulary at a time, about CHUNK_FLOATS logits each (fp16/bf16 GEMMs on a
GPU, fp32 or bf16 operands on the CPU), and each chunk's max per sequence, floored at 0, goes into fp32
[sequences, vocabulary] in the same loop (torch_sparse_kernel.py, or torch.segment_reduce). log1p (twice for
log1p_relu) follows on that: both are increasing, so max then activation equals SpladePooling's activation then
max (engines/sparse.py). The result stays on the device; nonzero_rows copies only its non-zero entries out.
"""

from __future__ import annotations

import numpy as np
import torch

from .sparse import SparseRows
from .torch_kernels import triton
from .torch_ops import Norm, PackedBatch, TorchOps
from .torch_sparse_kernel import segment_max_kernel
from .torch_weights import Weights

BLOCK_C = 128  # vocabulary columns per kernel program
# Logits per vocabulary chunk: on the CPU 16 MB of fp32, within the caches' reach; on a GPU 128 MB of fp16, which
# keeps the GEMMs 4096 columns wide up to 16,384 tokens (the largest graph bucket).
CHUNK_FLOATS = {"cpu": 1 << 22, "cuda": 1 << 26}


class SparseHead:
    """Called as a classification head is (encoder.Encoder.forward): fp32 [sequences, vocabulary] out."""

    def __init__(self, dense, activation: str, norm: Norm, decoder, bias, log1p_twice: bool) -> None:
        self.dense, self.activation, self.norm = dense, activation, norm  # dense: (weight, bias)
        self.decoder, self.bias = decoder, bias  # [vocabulary, hidden] in the GEMM dtype; [vocabulary]
        self.log1p_twice = log1p_twice
        self.chunk_floats = CHUNK_FLOATS[decoder.device.type]

    @classmethod
    def load(cls, w: Weights, dense: str, norm: str, decoder: str, bias: str, tied: str, activation: str, eps: float,
             log1p_twice: bool) -> SparseHead:  # fmt: skip
        """A family's MLM head by its weight names; a decoder tied to the word embeddings (`tied`) is saved once."""
        weight = w.gemm(decoder if w.has(decoder) else tied)
        return cls((w.gemm(dense + ".weight"), w(dense + ".bias")), activation, w.norm(norm, eps), weight, w(bias),
                   log1p_twice)  # fmt: skip

    @property
    def output_size(self) -> int:
        return int(self.decoder.shape[0])

    def __call__(self, x: torch.Tensor, batch: PackedBatch, ops: TorchOps) -> torch.Tensor:
        h = ops.norm(ops.ffn_up(x, *self.dense, self.activation), self.norm)
        tokens, vocabulary, n = h.shape[0], self.output_size, batch.n_seqs
        out = torch.empty((n, vocabulary), device=h.device, dtype=torch.float32)
        width = max(BLOCK_C, self.chunk_floats // max(tokens, 1) // BLOCK_C * BLOCK_C)
        if ops.kernels != "triton":  # a last segment takes a graph bucket's tail tokens, dropped below
            cu = batch.cu
            lengths = torch.cat([cu[1:] - cu[:-1], (tokens - cu[-1]).reshape(1)])
        for first in range(0, vocabulary, width):
            logits = ops.linear(h, self.decoder[first : first + width], self.bias[first : first + width])
            if ops.kernels == "triton":
                columns = logits.shape[1]
                segment_max_kernel[(n, triton.cdiv(columns, BLOCK_C))](
                    logits, batch.cu, out, columns, vocabulary, first, BLOCK_T=16, BLOCK_C=BLOCK_C, num_warps=4
                )
            else:
                pooled = torch.segment_reduce(logits, "max", lengths=lengths, axis=0, initial=0.0)
                out[:, first : first + width] = pooled[:n]
        out.log1p_()
        return out.log1p_() if self.log1p_twice else out


def nonzero_rows(pooled: torch.Tensor) -> SparseRows:
    """The rows' non-zero entries, found on the device; only their columns and values leave it, with each row's
    count (not a row index an entry: 8 bytes an entry, not 12), in one copy."""
    entries = pooled.nonzero()
    n, found = pooled.shape[0], len(entries)
    counts = torch.bincount(entries[:, 0], minlength=n).to(torch.int32)
    values = pooled[entries[:, 0], entries[:, 1]].float().view(torch.int32)
    packed = torch.cat([counts, entries[:, 1].to(torch.int32), values]).cpu().numpy()
    return SparseRows.of_counts(packed[:n], packed[n : n + found], packed[n + found :].view(np.float32))
