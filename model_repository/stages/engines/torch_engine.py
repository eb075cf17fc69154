"""Packed (padding-free) encoders on PyTorch: on an NVIDIA GPU (fp16, bf16) or on the CPU (fp32, bf16 GEMMs).

The architecture (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ModernBERT, ...) is the module of models/ that
config.json's model_type names; this engine gives it its blocks (torch_ops.py) and runs it on packed batches.

All sequences of a batch are concatenated into one token stream described by `cu_seqlens` (the
FlashAttention varlen layout); every GEMM runs on that stream, attention runs per sequence on the packed
layout, and pooling respects each sequence's own length. A sparse model's rows (task sparse: torch_sparse.py)
are pooled over the vocabulary on the device, and only their non-zero entries are copied out. A multi-vector model
(task multi_vector) pools nothing: every token's row goes through the projection (PROJECTION_FILE) and, fp16 on a
GPU (fp32 on the CPU) [tokens, dim], out; its batches carry each sequence's key length (a query's unattended
[MASK] expansion gets a row but is a key to none: torch_attention.py), which FlashAttention's varlen kernels cannot
take; only the rows of the tokens the stage keeps leave the device. A hybrid model (task hybrid, BGE-M3:
torch_hybrid.py) gives each sequence's dense vector, every token's weight, and the vector of every token but each
sequence's first. On CUDA each (token bucket, sequence bucket) shape is captured once as a CUDA graph that reads
its ids from a static device buffer; batches are padded to the bucket with tail tokens that belong to no sequence
(their rows never meet a real row: GEMMs and LayerNorm are row-wise and attention/pooling only read rows inside
`cu_seqlens`), and their outputs are dropped. Batches outside the buckets run the same code eagerly.

This module must import inside Triton's Python-backend stub, where `transformers` does not import:
it uses torch, numpy, safetensors and (optional, guarded) OpenAI Triton only.

Options (the `options` dict; values may be strings as they come from a config file):
  precision        fp16 | bf16 | fp32             (CPU: fp32, or bf16 = bf16 GEMM operands on AMX or AVX-512 BF16,
                   all else fp32)
  attention        auto | triton | flash | varlen | sdpa  (auto: triton where usable, but sdpa in fp32 on a GPU)
                   triton: our varlen kernel; flash: aten._flash_attention_forward varlen (FlashAttention-2);
                   varlen: torch.nn.attention.varlen.varlen_attn; sdpa: rows scattered into a padded
                   [sequences, max_len] grid and one masked SDPA call (the CPU path). flash and varlen run
                   plain attention only: a model with an attention bias or window gets triton or sdpa
  kernels          auto | triton | torch | compile  (embedding+LN, bias+GELU, residual+LN, pooling)
  gelu             auto | exact | tanh_epilogue   (tanh_epilogue: cuBLASLt GELU epilogue, tanh approximation;
                   auto: tanh_epilogue on CUDA in fp16/bf16, exact erf GELU elsewhere)
  residual_gemm    true | false: residual added by the GEMM (cuBLAS beta=1, in place), bias in the LayerNorm
                   kernel (default true on CUDA)
  cuda_graphs      true | false
  max_batch        largest sequence bucket captured as a graph (default 1024)
  max_graph_tokens largest token bucket captured as a graph (default 16384; larger batches run eagerly on
                   their exact shapes: launch overhead is hidden there and bucket padding is not)
  buckets_per_octave  token buckets per power of two (default 16: at most 6.25 % padding)
  max_graphs       graphs kept before new shapes run eagerly (default 256)
  spin_us          how long forward() polls for the GPU to finish before it sleeps on an event (default 1000;
                   -1: poll to the end, CUDA's own default for a process with one context). Polling answers a
                   short batch without a wake-up; sleeping frees the core during a long wait (many instances
                   sharing one GPU wait for each other) for the other instances and tritonserver
  attn_block_m, attn_block_n, attn_warps, attn_stages   Triton attention kernel launch (default 64, 64, 4, 2)
  threads          CPU intra-op threads (CPU path only)
  cpu_tokens_per_call  the CPU path runs a batch as length-sorted parts of about this many tokens (default 1024):
                   a part's activations stay in the cores' caches (MiniLM bf16, 2 cores: 128 texts 137 -> 197
                   texts/s, docs/benchmarks.md)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common.contract import HYBRID_GRAPH_OUTPUTS, PROJECTION_FILE, TOKEN_VECTORS, ServingSpec

from .base import Engine
from .hybrid import colbert_tokens
from .models import architecture
from .sparse import SparseRows
from .torch_hybrid import HybridHead, HybridHost, host_rows
from .torch_kernels import HAVE_TRITON, KernelCheck
from .torch_layout import (
    TYPE_SHIFT,
    HostSlot,
    cpu_chunks,
    key_lengths,
    key_view,
    layout_size,
    length_class,
    next_pow2,
    pack,
    token_bucket,
    token_parts,
    views,
)
from .torch_ops import PackedBatch, TorchOps, packed_batch
from .torch_sparse import nonzero_rows
from .torch_weights import Weights, load_state_dict

log = logging.getLogger(__name__)


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TRITON_HEAD_DIMS = (16, 32, 64, 128)  # what the Triton attention kernel's tl.dot tiles take


class TorchEngine(KernelCheck, Engine):
    """An architecture of models/ on one packed token stream per batch: pooled embeddings, logits, sparse rows or
    token vectors."""

    kind = "torch"

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        super().__init__(model_dir, spec, device, options)
        self.multi_vector, self.hybrid = spec.task == "multi_vector", spec.task == "hybrid"
        self.torch_device = torch.device(device)
        self.is_cuda = self.torch_device.type == "cuda"
        if self.is_cuda and self.torch_device.index is None:
            self.torch_device = torch.device("cuda", torch.cuda.current_device())
        opt = dict(options or {})
        precision = str(opt.get("precision", "fp16" if self.is_cuda else "fp32")).lower()
        if precision not in DTYPES:
            raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")
        # On the CPU bf16 means bf16 GEMM operands (AMX), everything else fp32; fp16 has no fast CPU path.
        self.gemm_bf16 = not self.is_cuda and precision == "bf16"
        if not self.is_cuda and precision == "fp16":
            log.info("CPU path runs fp32 (asked for fp16)")
            precision = "fp32"
        self.precision = precision
        self.dtype = torch.float32 if self.gemm_bf16 else DTYPES[precision]
        # Token vectors leave a GPU that computes in 16 bits as fp16 (half the bytes of fp32, no precision lost
        # that the encoder kept); the CPU's, fp32.
        self.vector_dtype = torch.float16 if self.is_cuda and self.dtype != torch.float32 else torch.float32
        if not self.is_cuda and "threads" in opt:
            torch.set_num_threads(int(opt["threads"]))
        self.cpu_tokens_per_call = int(opt.get("cpu_tokens_per_call", 1024))

        config = json.loads((self.model_dir / "config.json").read_text())
        family = architecture(config.get("model_type"))
        self.ops = self._choose_ops(opt)
        gemm = torch.bfloat16 if self.gemm_bf16 else self.dtype
        weights = Weights(load_state_dict(self.model_dir), family.prefix, self.torch_device, self.dtype, gemm)
        # A multi-vector or hybrid encoder is an embedder's, without head; the engine applies its own to the token rows.
        self.model = family(config, weights, self.ops, dataclasses.replace(spec, task="embedding") if
                            self.multi_vector or self.hybrid else spec)  # fmt: skip
        self.max_positions = self.model.max_positions
        self.output_size = self.model.output_size
        self.projection = None
        if self.multi_vector:
            self.projection = self._load_projection()
            self.output_size = self.projection[0].shape[0]
            self.model.plain_attention = False  # key lengths: not for FlashAttention (_fit_attention, the self-check)
        self.hybrid_head = HybridHead(self.model_dir, self.torch_device, self.dtype, gemm) if self.hybrid else None
        self.sparse = spec.task == "sparse"
        if spec.output_size and spec.output_size != self.output_size:
            raise ValueError(f"serving.json: output_size {spec.output_size}; the model gives {self.output_size}")
        self._fit_attention()

        # CUDA graphs and buckets.
        self.use_graphs = self.is_cuda and _as_bool(opt.get("cuda_graphs", True))
        self.max_batch = int(opt.get("max_batch", 1024))
        self.max_graph_tokens = int(opt.get("max_graph_tokens", 16384))
        self.buckets_per_octave = int(opt.get("buckets_per_octave", 16))
        self.max_graphs = int(opt.get("max_graphs", 256))
        self._graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.graph_captures = 0
        self.eager_runs = 0
        self._launch_only = False  # submit(): _forward_cuda returns the callable that waits for the rows

        if self.is_cuda:
            self.stream = torch.cuda.Stream(self.torch_device)
            self.spin_s = int(opt.get("spin_us", 1000)) / 1e6
            self._pool = torch.cuda.graph_pool_handle()
            cap = layout_size(self.max_graph_tokens, self.max_batch, self.tile_block, self.multi_vector)
            self._dev_in = torch.zeros(cap, dtype=torch.int32, device=self.torch_device)
            # A sparse model's [sequences, vocabulary] stays on the device: only its entries are copied (_rows).
            width = 0 if self.sparse else self.output_size
            rows = self.max_graph_tokens if self.multi_vector else self.max_batch  # a row per token, or per sequence
            # Two sets of pinned buffers: a batch is packed and launched (submit) while the last one still runs.
            out_dtype = self.vector_dtype if self.multi_vector else torch.float32
            self._slots = [HostSlot(cap, rows, width, out_dtype) for _ in range(2)]
            self._next_slot = 0
            self._hybrid_host = (HybridHost(self.output_size, self.hybrid_head.colbert_size, self.vector_dtype)
                                 if self.hybrid else None)  # fmt: skip
            if self.ops.kernels == "triton" or self.ops.attention == "triton":
                self._self_check()
        log.info(
            "engine torch: model_type=%s device=%s precision=%s attention=%s kernels=%s gelu=%s graphs=%s",
            config.get("model_type"), self.torch_device, self.precision, self.ops.attention, self.ops.kernels,
            self.ops.gelu, self.use_graphs,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------------
    def _choose_ops(self, opt: dict) -> TorchOps:
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.triton_usable = HAVE_TRITON and (self.is_cuda or interpret)
        kernels = str(opt.get("kernels", "auto")).lower()
        if kernels == "auto":
            kernels = "triton" if self.triton_usable else "torch"
        if kernels == "triton" and not self.triton_usable:
            log.warning("OpenAI Triton is not usable here; elementwise kernels fall back to torch ops")
            kernels = "torch"
        attention = str(opt.get("attention", "auto")).lower()
        if attention == "auto" and self.is_cuda and self.dtype == torch.float32:
            attention = "sdpa"  # the Triton kernel's IEEE fp32 tl.dot ran SPLADE at 0.59-0.63x (H100, 2026-12-05)
        elif attention == "auto":
            attention = "triton" if self.triton_usable else ("flash" if self.is_cuda else "sdpa")
        gelu = str(opt.get("gelu", "auto")).lower()
        if gelu == "auto":  # measured on an H200: the cuBLASLt epilogue saves a full pass over [T, 3072]
            gelu = "tanh_epilogue" if self.is_cuda and self.dtype != torch.float32 else "exact"
        if gelu == "tanh_epilogue" and not self.is_cuda:
            gelu = "exact"
        launch = tuple(int(opt.get(f"attn_{name}", default)) for name, default in
                       (("block_m", 64), ("block_n", 64), ("warps", 4), ("stages", 2)))  # fmt: skip
        residual_gemm = _as_bool(opt.get("residual_gemm", self.is_cuda))
        return TorchOps(self.dtype, self.gemm_bf16, kernels, attention, gelu, residual_gemm, launch)

    def _fit_attention(self) -> None:
        """The attention the model can run exactly: the Triton kernel only for the head sizes it tiles, FlashAttention
        only in fp16/bf16 on a GPU and for plain attention; else the Triton kernel where usable, else SDPA."""
        ops, triton_fits = self.ops, self.triton_usable and self.model.head_dim in TRITON_HEAD_DIMS
        if ops.attention == "triton" and not triton_fits:
            ops.attention = "flash" if self.is_cuda and self.model.plain_attention else "sdpa"
        flash_fits = self.is_cuda and self.dtype != torch.float32 and self.model.plain_attention
        if ops.attention in ("flash", "varlen") and not flash_fits:
            ops.attention = "triton" if triton_fits else "sdpa"

    def _load_projection(self) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """The Dense (fp32 weight [dim, hidden], bias) and whether its vectors are L2-normalized: the file's
        `normalize` (export's save_projection), else yes: an export older than the flag, whose checkpoints (PyLate's,
        the random-init one) all end in Normalize. serving.json's normalize is the pooling's, false for this task."""
        with np.load(self.model_dir / PROJECTION_FILE) as arrays:
            found = {name: torch.from_numpy(arrays[name]) for name in arrays.files}
        weight = found["weight"].float().to(self.torch_device)
        bias = found["bias"].float().to(self.torch_device) if "bias" in found else None
        return weight, bias, bool(found["normalize"]) if "normalize" in found else True

    # ------------------------------------------------------------------------------------------------------
    @property
    def tile_block(self) -> int:
        """Query rows per tile of the packed layout: the Triton attention's BLOCK_M, 0 for the others."""
        return self.ops.launch[0] if self.ops.attention == "triton" else 0

    def _encode(self, ids, cu, tiles, n_seqs: int, max_len: int, keys=None) -> torch.Tensor:
        """The model on one packed stream. ids [T], cu [n_seqs + 1] int32; rows past cu[-1] are padding; keys: a
        multi-vector batch's key lengths [n_seqs + 1]."""
        return self._head(packed_batch(ids, cu, tiles, n_seqs, max_len, keys))

    def _head(self, batch: PackedBatch):
        """What the task answers of a packed batch: pooled rows, logits, token vectors or a hybrid model's three."""
        if self.hybrid_head is not None:
            dense, weights, vectors = self.hybrid_head(self.model.hidden_states(batch), batch, self.ops)
            return dense, weights, vectors.to(self.vector_dtype)
        if self.projection is None:
            return self.model.forward(batch)
        weight, bias, normalize = self.projection
        vectors = F.linear(self.model.hidden_states(batch).float(), weight, bias)
        return (F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors).to(self.vector_dtype)

    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
                       wanted: frozenset[str] | None = None, kept: np.ndarray | None = None):  # fmt: skip
        """types: a pair model's token types; a multi-vector model's `attended` (1: the token is a key to its
        sequence; 0 only for a suffix, a query's unattended expansion). wanted: a hybrid model's outputs to copy out
        (None: all; the graph computes all three either way). kept: a multi-vector model's tokens whose rows come
        back (a hybrid model's colbert vectors: every token's but each text's first)."""
        wanted = HYBRID_GRAPH_OUTPUTS if wanted is None else wanted
        if self.hybrid and TOKEN_VECTORS in wanted:
            kept = colbert_tokens(lengths)
        if self.model.pair_types:
            ids = ids | (types.astype(np.int32) << TYPE_SHIFT)
        n = len(lengths)
        if n == 0:
            return SparseRows.joined([]) if self.sparse else np.zeros((0, self.output_size), dtype=np.float32)
        keys = key_lengths(lengths, types) if self.multi_vector else None
        max_len = int(lengths.max())
        if max_len > self.max_positions:
            raise ValueError(f"a sequence has {max_len} tokens; the model takes at most {self.max_positions}")
        tokens = len(ids)
        self.computed_tokens = tokens
        if not self.is_cuda:
            return self._forward_cpu(ids, lengths, tokens, keys, wanted, kept)
        return self._forward_cuda(ids, lengths, tokens, max_len, keys, wanted, kept)

    def _rows(self, out, wanted, kept):
        """The CPU batch's rows: fp32 [n, output_size] (a multi-vector model's kept tokens'), a sparse model's
        SparseRows or a hybrid model's HybridRows."""
        if self.hybrid:
            return host_rows(out, wanted, kept)
        if self.multi_vector and kept is not None:
            return out.numpy()[kept]
        return nonzero_rows(out) if self.sparse else out.numpy().astype(np.float32, copy=True)

    @torch.inference_mode()
    def _forward_cpu(self, ids, lens, tokens, keys, wanted, kept):
        if tokens <= self.cpu_tokens_per_call:
            return self._rows(self._encode_eager(ids, lens, int(lens.max()), keys), wanted, kept)
        out = torch.empty((tokens if self.multi_vector else len(lens), self.output_size), dtype=torch.float32)
        if self.hybrid:  # per sequence, per token, per token
            out = (out, torch.empty(tokens), torch.empty((tokens, self.hybrid_head.colbert_size)))
        starts = np.cumsum(lens) - lens
        for rows in token_parts(lens, self.cpu_tokens_per_call):
            places = np.concatenate([np.arange(starts[row], starts[row] + lens[row]) for row in rows])
            part_keys = None if keys is None else keys[rows]
            result = self._encode_eager(ids[places], lens[rows], int(lens[rows].max()), part_keys)
            if self.hybrid:
                for whole, part, index in zip(out, result, (rows, places, places), strict=True):
                    whole[torch.from_numpy(index)] = part
            else:
                out[torch.from_numpy(places if self.multi_vector else rows)] = result
        return self._rows(out, wanted, kept)

    def _encode_eager(self, ids: np.ndarray, lens: np.ndarray, max_len: int, keys=None) -> torch.Tensor:
        """One packed batch on its exact shape, without a graph (the CPU path; the kernels' self-check)."""
        return self._head(self._eager_batch(ids, lens, max_len, keys))

    def _eager_batch(self, ids: np.ndarray, lens: np.ndarray, max_len: int, keys=None) -> PackedBatch:
        tokens, n, keyed = len(ids), len(lens), keys is not None
        buf = np.empty(layout_size(tokens, n, self.tile_block, keyed), dtype=np.int32)
        pack(buf, ids, lens, tokens, n, self.tile_block, keys)
        dev = torch.from_numpy(buf).to(self.torch_device)
        ids, cu, tiles = views(dev, tokens, n, self.tile_block)
        if self.ops.attention == "sdpa" and not self.is_cuda:
            tiles = cpu_chunks(lens)
        return packed_batch(ids, cu, tiles, n, max_len, key_view(dev, tokens, n, self.tile_block) if keyed else None)

    @torch.inference_mode()
    def pool_spans(self, ids: np.ndarray, lengths: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """Late chunking (Engine.pool_spans): one eager pass (each batch's spans are its own: no graph), the spans
        mean-pooled from the last hidden states, on the device."""
        if self.spec.task != "embedding":
            raise ValueError(f"late chunking pools an embedder's token states, not a {self.spec.task} model's")
        max_len = int(lengths.max())
        if max_len > self.max_positions:
            raise ValueError(f"a sequence has {max_len} tokens; the model takes at most {self.max_positions}")
        self.computed_tokens = len(ids)
        longest = (
            max(max_len, length_class(max_len, bool(self.tile_block), self.max_positions)) if self.is_cuda else max_len
        )
        with torch.cuda.stream(self.stream) if self.is_cuda else contextlib.nullcontext():
            states = self.model.hidden_states(self._eager_batch(ids, lengths, longest))
            cu = torch.from_numpy(np.asarray(bounds, dtype=np.int32)).to(self.torch_device)
            spans = packed_batch(states.new_empty(len(ids), dtype=torch.int32), cu, None, len(cu) - 1, 0)
            return self.ops.pool(states, spans, "mean", self.spec.normalize).cpu().numpy()

    def _keys(self, dev: torch.Tensor, tokens: int, seqs: int) -> torch.Tensor | None:
        return key_view(dev, tokens, seqs, self.tile_block) if self.multi_vector else None

    @property
    def launches_ahead(self) -> bool:
        """On a GPU, an embedder's, classifier's, reranker's or multi-vector model's batch is launched and its rows
        are copied out asynchronously; the rest computes at once."""
        return self.is_cuda and not (self.sparse or self.hybrid)

    def submit(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None,
               wanted: frozenset[str] | None = None, kept: np.ndarray | None = None):  # fmt: skip
        """Engine.submit: launched where launches_ahead says; the callable waits for the rows."""
        if not self.launches_ahead:
            return super().submit(ids, lengths, types, wanted, kept)
        self._launch_only = True
        try:
            return self.forward_packed(ids, lengths, types, wanted, kept)
        finally:
            self._launch_only = False

    @torch.inference_mode()
    def _forward_cuda(self, ids, lens, tokens, max_len, keys, wanted, kept):
        n = len(lens)
        graph = self.use_graphs and n <= self.max_batch and tokens <= self.max_graph_tokens
        if graph:
            t_b = min(token_bucket(tokens, self.buckets_per_octave), self.max_graph_tokens)
            n_b = min(next_pow2(n), self.max_batch)
            key = (t_b, n_b, length_class(max_len, bool(self.tile_block), self.max_positions))
            graph = key in self._graphs or len(self._graphs) < self.max_graphs
        if not graph:
            t_b, n_b = tokens, n
        self.computed_tokens = t_b  # a graph bucket computes its tail tokens too
        size = layout_size(t_b, n_b, self.tile_block, self.multi_vector)
        rows = n if not self.multi_vector else tokens if kept is None else int(kept.sum())
        slot = self._slots[self._next_slot]
        self._next_slot ^= 1
        slot.wait(self.spin_s)  # its last batch's copies are done before its buffers are written again
        host_in, host_out = slot.sized(size, rows)
        pack(host_in.numpy()[:size], ids, lens, t_b, n_b, self.tile_block, keys)
        with torch.cuda.stream(self.stream):
            # Token rows leave the device only where kept: the positions go over with the ids.
            index = None if kept is None else slot.index_on(kept, self.torch_device)
            if graph:
                self._dev_in[:size].copy_(host_in[:size], non_blocking=True)
                entry = self._graphs.get(key)
                if entry is None:
                    entry = self._capture(key)
                entry[0].replay()
                out = entry[1]
            else:
                dev = host_in[:size].to(self.torch_device, non_blocking=True)
                ids, cu, tiles = views(dev, t_b, n_b, self.tile_block)
                longest = max(max_len, length_class(max_len, bool(self.tile_block), self.max_positions))
                out = self._encode(ids, cu, tiles, n_b, longest, self._keys(dev, t_b, n_b))
                self.eager_runs += 1
            if self.sparse:
                return nonzero_rows(out[:n])
            if self.hybrid:
                rows_of = self._hybrid_host.stage(out, n, tokens, wanted, index)
                slot.record(self.stream)
                slot.wait(self.spin_s)
                return rows_of()
            host_out[:rows].copy_(out[:rows] if index is None else out.index_select(0, index), non_blocking=True)
            slot.record(self.stream)

        def rows_out() -> np.ndarray:
            slot.wait(self.spin_s)
            return host_out[:rows].numpy().copy()

        return rows_out if self._launch_only else rows_out()

    def _capture(self, key):
        t_b, n_b, len_class = key
        size = layout_size(t_b, n_b, self.tile_block, self.multi_vector)
        dev = self._dev_in[:size]
        ids, cu, tiles = views(dev, t_b, n_b, self.tile_block)
        keys = self._keys(dev, t_b, n_b)  # in the static buffer: each replay reads its batch's, as cu_seqlens
        # One eager run first: compiles Triton kernels for these shapes and warms cuBLAS outside the capture.
        self._encode(ids, cu, tiles, n_b, len_class, keys)
        self.stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
            out = self._encode(ids, cu, tiles, n_b, len_class, keys)
        self._graphs[key] = (g, out)
        self.graph_captures += 1
        return self._graphs[key]
