"""The torch engine's hybrid head (task hybrid: BGE-M3, export/hybrid_export.py): from the last hidden states of
the packed token stream, each sequence's first token normalized (the dense vector), every token's ReLU'd sparse
weight and every token's normalized colbert vector, all fp32 on the device (the engine narrows the vectors to fp16
on a GPU, torch_engine.py). The engine copies the three out as HybridRows, the colbert vectors of every token but
each text's first only; the stage takes each text's lexical maximum per token id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common.contract import HYBRID_GRAPH_OUTPUTS, HYBRID_HEADS_FILE

from .hybrid import HybridRows
from .torch_ops import PackedBatch, TorchOps


class HybridHead:
    """Called as a classification head is (encoder.Encoder.forward): (dense, weights, vectors) out."""

    def __init__(self, model_dir: Path, device: torch.device, dtype: torch.dtype, gemm_dtype: torch.dtype) -> None:
        with np.load(Path(model_dir) / HYBRID_HEADS_FILE) as heads:
            arrays = {name: torch.from_numpy(heads[name]).to(device) for name in heads.files}
        # One GEMM for both heads: the colbert rows, then the sparse row (its weights stay fp32 after it).
        self.weight = torch.cat([arrays["colbert_weight"], arrays["sparse_weight"]]).to(gemm_dtype).contiguous()
        self.bias = torch.cat([arrays["colbert_bias"], arrays["sparse_bias"]]).to(dtype).contiguous()
        self.colbert_size = int(arrays["colbert_weight"].shape[0])
        self.hidden = int(self.weight.shape[1])

    @property
    def output_size(self) -> int:
        return self.hidden  # the dense vector's width: what serving.json's output_size says

    def __call__(self, x: torch.Tensor, batch: PackedBatch, ops: TorchOps):
        first = batch.cu[:-1].long().clamp(max=x.shape[0] - 1)
        dense = F.normalize(x.index_select(0, first).float(), dim=1)
        both = ops.linear(x, self.weight, self.bias).float()
        vectors = F.normalize(both[:, : self.colbert_size], dim=1)
        return dense, torch.relu(both[:, self.colbert_size]), vectors


class HybridHost:
    """The three outputs' copies into pinned host memory, fresh for each batch from torch's caching host allocator (a
    freed block is reused once its copy is done), so that the rows are answered as views, without a host copy."""

    def __init__(self, hidden: int, colbert_size: int, vector_dtype: torch.dtype) -> None:
        self.widths = (hidden, 0, colbert_size)
        self.dtypes = (torch.float32, torch.float32, vector_dtype)

    def stage(self, out: tuple[torch.Tensor, ...], sequences: int, tokens: int, wanted, colbert: torch.Tensor | None):
        """Queues the copies of the batch's wanted rows on the current stream, the colbert vectors of the tokens at
        `colbert` (device positions) only; the returned call, once the stream is done, gives them as HybridRows."""
        sizes = (sequences, tokens, 0 if colbert is None else len(colbert))
        sources = (out[0], out[1], out[2] if colbert is None else out[2].index_select(0, colbert))
        copies = []
        for name, rows, count, width, dtype in zip(HYBRID_GRAPH_OUTPUTS, sources, sizes, self.widths, self.dtypes,
                                                   strict=True):  # fmt: skip
            if name not in wanted or not count:
                copies.append(None)
                continue
            host = torch.empty((count, width) if width else (count,), dtype=dtype, pin_memory=True)
            copies.append(host.copy_(rows[:count], non_blocking=True))
        return lambda: HybridRows(*(None if host is None else host.numpy() for host in copies))


def host_rows(out: tuple[torch.Tensor, ...], wanted, colbert: np.ndarray | None) -> HybridRows:
    """A CPU batch's wanted outputs as HybridRows, the colbert vectors of the tokens `colbert` marks."""
    dense, weights, vectors = (rows.numpy() if name in wanted else None
                               for name, rows in zip(HYBRID_GRAPH_OUTPUTS, out, strict=True))  # fmt: skip
    return HybridRows(None if dense is None else dense.astype(np.float32, copy=True),
                      None if weights is None else weights.astype(np.float32, copy=True),
                      None if vectors is None else vectors[colbert].astype(np.float32, copy=False))  # fmt: skip
