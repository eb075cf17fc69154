"""Packed (padding-free) BERT encoder on PyTorch: on an NVIDIA GPU (fp16, bf16) or on the CPU (fp32, bf16 GEMMs).

All sequences of a batch are concatenated into one token stream described by `cu_seqlens` (the
FlashAttention varlen layout); every GEMM runs on that stream, attention runs per sequence on the packed
layout, and pooling respects each sequence's own length. On CUDA each (token bucket, sequence bucket)
shape is captured once as a CUDA graph that reads its ids from a static device buffer; batches are padded
to the bucket with tail tokens that belong to no sequence (their rows never meet a real row: GEMMs and
LayerNorm are row-wise and attention/pooling only read rows inside `cu_seqlens`), and their outputs are
dropped. Batches outside the buckets run the same code eagerly.

This module must import inside Triton's Python-backend stub, where `transformers` does not import:
it uses torch, numpy, safetensors and (optional, guarded) OpenAI Triton only.

Options (the `options` dict; values may be strings as they come from a config file):
  precision        fp16 | bf16 | fp32             (CPU: fp32, or bf16 = bf16 GEMM operands on AMX or AVX-512 BF16,
                   all else fp32)
  attention        auto | triton | flash | varlen | sdpa
                   triton: our varlen kernel; flash: aten._flash_attention_forward varlen (FlashAttention-2);
                   varlen: torch.nn.attention.varlen.varlen_attn; sdpa: rows scattered into a padded
                   [sequences, max_len] grid and one masked SDPA call (the CPU path)
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

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common.contract import ServingSpec

from .base import Engine
from .torch_kernels import (
    HAVE_TRITON,
    KernelCheck,
    add_ln_kernel,
    embed_ln_kernel,
    gelu_kernel,
    pool_kernel,
    torch_add_ln,
    torch_gelu,
    triton,
    varlen_attn_kernel,
)
from .torch_layout import (
    ID_MASK,
    TYPE_SHIFT,
    cpu_chunks,
    layout_size,
    length_class,
    next_pow2,
    pack,
    token_bucket,
    token_parts,
    views,
)
from .torch_weights import BertCheckpoint, Layer, load_state_dict

log = logging.getLogger(__name__)


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


POOL_MODES = {"mean": 0, "cls": 1, "max": 2, "mean_sqrt_len": 3}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class TorchEngine(BertCheckpoint, KernelCheck, Engine):
    """BERT encoder + pooling/normalize or pooler+classifier on one packed token stream per batch."""

    def __init__(self, model_dir: Path, spec: ServingSpec, device: str, options: dict) -> None:
        super().__init__(model_dir, spec, device, options)
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
        if not self.is_cuda and "threads" in opt:
            torch.set_num_threads(int(opt["threads"]))
        self.cpu_tokens_per_call = int(opt.get("cpu_tokens_per_call", 1024))

        config = json.loads((self.model_dir / "config.json").read_text())
        self._read_config(config)
        if spec.task == "embedding" and spec.pooling not in POOL_MODES:
            raise ValueError(f"pooling {spec.pooling!r} is not supported; known: {sorted(POOL_MODES)}")
        self._load_weights(load_state_dict(self.model_dir))

        # Kernel choices.
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        triton_usable = HAVE_TRITON and (self.is_cuda or interpret)
        kernels = str(opt.get("kernels", "auto")).lower()
        if kernels == "auto":
            kernels = "triton" if triton_usable else "torch"
        if kernels == "triton" and not triton_usable:
            log.warning("OpenAI Triton is not usable here; elementwise kernels fall back to torch ops")
            kernels = "torch"
        attention = str(opt.get("attention", "auto")).lower()
        if attention == "auto":
            attention = self._default_attention(triton_usable)
        if attention == "triton" and (not triton_usable or self.head_dim not in (16, 32, 64, 128)):
            attention = "flash" if self.is_cuda else "sdpa"
        if attention in ("flash", "varlen") and (not self.is_cuda or self.dtype == torch.float32):
            attention = "triton" if triton_usable and self.head_dim in (16, 32, 64, 128) else "sdpa"
        gelu = str(opt.get("gelu", "auto")).lower()
        if gelu == "auto":  # measured on an H200: the cuBLASLt epilogue saves a full pass over [T, 3072]
            gelu = "tanh_epilogue" if self.is_cuda and self.dtype != torch.float32 else "exact"
        if gelu == "tanh_epilogue" and not self.is_cuda:
            gelu = "exact"
        self.residual_gemm = _as_bool(opt.get("residual_gemm", self.is_cuda))
        self.kernels, self.attention, self.gelu = kernels, attention, gelu
        self.attn_block_m = int(opt.get("attn_block_m", 64))
        self.attn_block_n = int(opt.get("attn_block_n", 64))
        self.attn_warps = int(opt.get("attn_warps", 4))
        self.attn_stages = int(opt.get("attn_stages", 2))

        # CUDA graphs and buckets.
        self.use_graphs = self.is_cuda and _as_bool(opt.get("cuda_graphs", True))
        self.max_batch = int(opt.get("max_batch", 1024))
        self.max_graph_tokens = int(opt.get("max_graph_tokens", 16384))
        self.buckets_per_octave = int(opt.get("buckets_per_octave", 16))
        self.max_graphs = int(opt.get("max_graphs", 256))
        self._graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.graph_captures = 0
        self.eager_runs = 0

        if kernels == "compile":
            self._add_ln_compiled = torch.compile(torch_add_ln, dynamic=True)
            self._gelu_compiled = torch.compile(torch_gelu, dynamic=True)

        if self.is_cuda:
            self.stream = torch.cuda.Stream(self.torch_device)
            self.spin_s = int(opt.get("spin_us", 1000)) / 1e6
            self._done = torch.cuda.Event(blocking=True)
            self._pool = torch.cuda.graph_pool_handle()
            cap = layout_size(self.max_graph_tokens, self.max_batch, self.tile_block)
            self._dev_in = torch.zeros(cap, dtype=torch.int32, device=self.torch_device)
            self._host_in = torch.empty(cap, dtype=torch.int32, pin_memory=True)
            self._host_out = torch.empty((self.max_batch, self.output_size), dtype=torch.float32, pin_memory=True)
            if self.kernels == "triton" or self.attention == "triton":
                self._self_check()
        log.info(
            "engine torch: device=%s precision=%s attention=%s kernels=%s gelu=%s graphs=%s",
            self.torch_device, self.precision, self.attention, self.kernels, self.gelu, self.use_graphs,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------------
    def _default_attention(self, triton_usable: bool) -> str:
        if not self.is_cuda:
            return "triton" if triton_usable else "sdpa"
        return "triton" if triton_usable else "flash"

    # ------------------------------------------------------------------------------------------------------
    # Building blocks (each has an OpenAI Triton and a torch implementation)
    # ------------------------------------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        n = ids.shape[0]
        if self.kernels == "triton":
            out = torch.empty((n, self.hidden), device=ids.device, dtype=self.dtype)
            block_r = 4
            pairs = self.spec.pairs
            embed_ln_kernel[(triton.cdiv(n, block_r),)](
                ids, pos, self.word, self.posw, self.types_table if pairs else self.type0, self.emb_ln[0],
                self.emb_ln[1], out, n, self.eps, PAIRS=pairs, SHIFT=TYPE_SHIFT,
                HIDDEN=self.hidden, BLOCK_H=self.block_h, BLOCK_R=block_r, num_warps=4,
            )  # fmt: skip
            return out
        if self.spec.pairs:
            ids = ids.long()
            types = F.embedding(ids >> TYPE_SHIFT, self.types_table)
            x = F.embedding(ids & ID_MASK, self.word) + F.embedding(pos.long(), self.posw) + types
            return F.layer_norm(x, (self.hidden,), self.emb_ln_t[0], self.emb_ln_t[1], self.eps)
        x = F.embedding(ids.long(), self.word) + F.embedding(pos.long(), self.posw) + self.type0
        return F.layer_norm(x, (self.hidden,), self.emb_ln_t[0], self.emb_ln_t[1], self.eps)

    def _add_ln(self, y: torch.Tensor, res: torch.Tensor | None, bias: torch.Tensor | None, ln, ln_t) -> torch.Tensor:
        """LayerNorm(y [+ res] [+ bias]); the Triton kernel writes into y."""
        if self.kernels == "triton":
            n = y.shape[0]
            block_r = 4
            add_ln_kernel[(triton.cdiv(n, block_r),)](
                y, y if res is None else res, y if bias is None else bias, ln[0], ln[1], n, self.eps,
                HAS_RES=res is not None, HAS_BIAS=bias is not None,
                HIDDEN=self.hidden, BLOCK_H=self.block_h, BLOCK_R=block_r, num_warps=4,
            )  # fmt: skip
            return y
        other = res if bias is None else (bias if res is None else res + bias)
        fn = self._add_ln_compiled if self.kernels == "compile" else torch_add_ln
        return fn(y, other, ln_t[0], ln_t[1], self.eps)

    def _proj_add_ln(self, inp, weight, bias, x, ln, ln_t) -> torch.Tensor:
        """LayerNorm(x + inp @ weight^T + bias): the residual rides in the GEMM (x += inp @ W^T, cuBLAS beta=1)
        and the bias in the LayerNorm kernel, or the bias in the GEMM epilogue and the residual in the kernel."""
        if self.residual_gemm:
            return self._add_ln(x.addmm_(inp, weight.t()), None, bias, ln, ln_t)
        return self._add_ln(self._linear(inp, weight, bias), x, None, ln, ln_t)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x @ weight^T + bias; CPU bf16: the operands rounded to bf16 (AMX tiles), the bias added in fp32."""
        if self.gemm_bf16:
            return F.linear(x.to(torch.bfloat16), weight).float().add_(bias)
        return F.linear(x, weight, bias)

    def _ffn_up(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        if self.gelu == "tanh_epilogue":
            return torch._addmm_activation(layer.b1, x, layer.w1.t(), use_gelu=True)
        h = self._linear(x, layer.w1, layer.b1)
        if self.kernels == "triton":
            n = h.numel()
            block = 2048
            gelu_kernel[(triton.cdiv(n, block),)](h, n, TANH=self.tanh_gelu, BLOCK=block, num_warps=8)
            return h
        if self.kernels == "compile":
            return self._gelu_compiled(h, self.tanh_gelu)
        return torch_gelu(h, self.tanh_gelu)

    def _attend(self, qkv: torch.Tensor, cu: torch.Tensor, tiles, max_len: int, seg, pos) -> torch.Tensor:
        t = qkv.shape[0]
        if self.attention == "triton":
            out = torch.empty((t, self.hidden), device=qkv.device, dtype=qkv.dtype)
            tile_seq, tile_m = tiles
            qk_scale = self.scale * 1.4426950408889634  # exp2 in the kernel
            varlen_attn_kernel[(tile_seq.shape[0], self.heads)](
                qkv, out, cu, tile_seq, tile_m, qk_scale, qkv.stride(0), out.stride(0),
                HIDDEN=self.hidden, HEAD_DIM=self.head_dim, BLOCK_M=self.attn_block_m, BLOCK_N=self.attn_block_n,
                num_warps=self.attn_warps, num_stages=self.attn_stages,
            )  # fmt: skip
            return out
        q, k, v = qkv.view(t, 3, self.heads, self.head_dim).unbind(1)
        if self.attention == "flash":
            out = torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, max_len, max_len, 0.0, False, False, scale=self.scale
            )[0]
            return out.reshape(t, self.hidden)
        if self.attention == "varlen":
            from torch.nn.attention.varlen import varlen_attn

            return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=self.scale).reshape(t, self.hidden)
        if isinstance(tiles, list):
            return self._attend_chunks(qkv, tiles)
        # sdpa: scatter the packed rows into a padded [seqs + 1, max_len] grid, one masked SDPA call, gather back
        # (fp32 on the GPU; the extra row block takes the bucket's tail tokens).
        n_seqs = cu.shape[0] - 1
        slot = seg.long() * max_len + pos.long()
        grid = qkv.new_zeros(((n_seqs + 1) * max_len, 3 * self.hidden))
        grid.index_copy_(0, slot, qkv)
        grid = grid.view(n_seqs + 1, max_len, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        lens = torch.cat([cu[1:] - cu[:-1], cu.new_zeros(1)])
        valid = torch.arange(max_len, device=qkv.device)[None, :] < lens[:, None]
        valid[:, 0] = True  # empty rows attend to one zero key instead of producing NaN
        mask = valid[:, None, None, :]
        o = F.scaled_dot_product_attention(grid[0], grid[1], grid[2], attn_mask=mask, scale=self.scale)
        return o.transpose(1, 2).reshape(-1, self.hidden).index_select(0, slot)

    def _attend_chunks(self, qkv: torch.Tensor, chunks: list) -> torch.Tensor:
        """CPU attention: one masked SDPA call per chunk of sequences of similar length (layout's cpu_chunks),
        each padded to its own longest sequence. One grid padded to the batch's longest cost 2/3 of the CPU time."""
        padded = torch.cat([qkv, qkv.new_zeros((1, qkv.shape[1]))])  # the last row: what padding slots read
        out = torch.empty((qkv.shape[0], self.hidden), dtype=qkv.dtype)
        for gather, real, targets in chunks:
            rows, width = real.shape
            grid = padded.index_select(0, gather).view(rows, width, 3, self.heads, self.head_dim)
            q, k, v = grid.permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=real[:, None, None, :], scale=self.scale)
            out.index_copy_(0, targets, o.transpose(1, 2).reshape(rows * width, self.hidden)[real.reshape(-1)])
        return out

    def _pool_head(self, x: torch.Tensor, cu: torch.Tensor, seg: torch.Tensor, n_seqs: int) -> torch.Tensor:
        """fp32 [n_seqs, output_size]: pooled (normalized) embeddings or classifier logits."""
        if self.spec.task in ("classification", "rerank"):
            first = cu[:-1].long().clamp(max=x.shape[0] - 1)
            h = x.index_select(0, first).float()
            if self.pooler is not None:
                h = torch.tanh(F.linear(h, *self.pooler))
            return F.linear(h, *self.classifier)
        mode = POOL_MODES[self.spec.pooling]
        if self.kernels == "triton":
            out = torch.empty((n_seqs, self.hidden), device=x.device, dtype=torch.float32)
            pool_kernel[(n_seqs,)](
                x, cu, out, HIDDEN=self.hidden, MODE=mode, NORMALIZE=bool(self.spec.normalize), BLOCK_T=16,
                BLOCK_H=self.block_h, num_warps=4,
            )  # fmt: skip
            return out
        lens = (cu[1:] - cu[:-1]).float().clamp(min=1.0)[:, None]
        seg_l = seg.long()
        if mode == 1:
            first = cu[:-1].long().clamp(max=x.shape[0] - 1)
            pooled = x.index_select(0, first).float() * (cu[1:] > cu[:-1])[:, None]
        elif mode == 2:
            pooled = torch.full((n_seqs + 1, self.hidden), float("-inf"), device=x.device, dtype=torch.float32)
            pooled.scatter_reduce_(0, seg_l[:, None].expand(-1, self.hidden), x.float(), "amax")
            pooled = pooled[:n_seqs]
            pooled = torch.where(torch.isinf(pooled), torch.zeros_like(pooled), pooled)
        else:
            sums = torch.zeros((n_seqs + 1, self.hidden), device=x.device, dtype=torch.float32)
            sums.index_add_(0, seg_l, x.float())
            pooled = sums[:n_seqs] / (lens if mode == 0 else lens.sqrt())
        if self.spec.normalize:
            pooled = F.normalize(pooled, p=2.0, dim=-1, eps=1e-12)
        return pooled

    def _encode(self, ids, cu, tiles, n_seqs: int, max_len: int) -> torch.Tensor:
        """The whole model on one packed stream. ids [T], cu [n_seqs + 1] int32; rows past cu[-1] are padding."""
        t = ids.shape[0]
        ar = torch.arange(t, device=ids.device, dtype=torch.int32)
        seg = torch.searchsorted(cu[1:], ar, right=True, out_int32=True)  # sequence of each token; n_seqs = tail
        pos = torch.where(seg < n_seqs, ar - cu.index_select(0, seg), 0)
        x = self._embed(ids, pos)
        for layer in self.layers:
            qkv = self._linear(x, layer.wqkv, layer.bqkv)
            ctx = self._attend(qkv, cu, tiles, max_len, seg, pos)
            x = self._proj_add_ln(ctx, layer.wo, layer.bo, x, layer.ln1, layer.ln1_t)
            h = self._ffn_up(x, layer)
            x = self._proj_add_ln(h, layer.w2, layer.b2, x, layer.ln2, layer.ln2_t)
        return self._pool_head(x, cu, seg, n_seqs)

    # ------------------------------------------------------------------------------------------------------
    # Packing, buckets, graphs
    # ------------------------------------------------------------------------------------------------------
    @property
    def tile_block(self) -> int:
        """Query rows per tile of the packed layout: the Triton attention's BLOCK_M, 0 for the others."""
        return self.attn_block_m if self.attention == "triton" else 0

    def forward_packed(self, ids: np.ndarray, lengths: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
        if self.spec.pairs:
            ids = ids | (types.astype(np.int32) << TYPE_SHIFT)
        n = len(lengths)
        if n == 0:
            return np.zeros((0, self.output_size), dtype=np.float32)
        max_len = int(lengths.max())
        if max_len > self.max_positions:
            raise ValueError(f"a sequence has {max_len} tokens; the model takes at most {self.max_positions}")
        tokens = len(ids)
        self.computed_tokens = tokens
        if not self.is_cuda:
            return self._forward_cpu(ids, lengths, tokens)
        return self._forward_cuda(ids, lengths, tokens, max_len)

    @torch.inference_mode()
    def _forward_cpu(self, ids, lens, tokens) -> np.ndarray:
        if tokens <= self.cpu_tokens_per_call:
            return self._encode_eager(ids, lens, int(lens.max())).numpy().astype(np.float32, copy=True)
        out = np.empty((len(lens), self.output_size), dtype=np.float32)
        starts = np.cumsum(lens) - lens
        for rows in token_parts(lens, self.cpu_tokens_per_call):
            part = np.concatenate([ids[starts[row] : starts[row] + lens[row]] for row in rows])
            out[rows] = self._encode_eager(part, lens[rows], int(lens[rows].max())).numpy()
        return out

    def _encode_eager(self, ids: np.ndarray, lens: np.ndarray, max_len: int) -> torch.Tensor:
        """One packed batch on its exact shape, without a graph (the CPU path; the kernels' self-check)."""
        tokens, n = len(ids), len(lens)
        buf = np.empty(layout_size(tokens, n, self.tile_block), dtype=np.int32)
        pack(buf, ids, lens, tokens, n, self.tile_block)
        ids, cu, tiles = views(torch.from_numpy(buf).to(self.torch_device), tokens, n, self.tile_block)
        if self.attention == "sdpa" and not self.is_cuda:
            tiles = cpu_chunks(lens)
        return self._encode(ids, cu, tiles, n, max_len)

    @torch.inference_mode()
    def _forward_cuda(self, ids, lens, tokens, max_len) -> np.ndarray:
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
        size = layout_size(t_b, n_b, self.tile_block)
        if size > self._host_in.numel():
            self._host_in = torch.empty(size, dtype=torch.int32, pin_memory=True)
        if n > self._host_out.shape[0]:
            self._host_out = torch.empty((n, self.output_size), dtype=torch.float32, pin_memory=True)
        pack(self._host_in.numpy()[:size], ids, lens, t_b, n_b, self.tile_block)
        with torch.cuda.stream(self.stream):
            if graph:
                self._dev_in[:size].copy_(self._host_in[:size], non_blocking=True)
                entry = self._graphs.get(key)
                if entry is None:
                    entry = self._capture(key)
                entry[0].replay()
                out = entry[1]
            else:
                dev = self._host_in[:size].to(self.torch_device, non_blocking=True)
                ids, cu, tiles = views(dev, t_b, n_b, self.tile_block)
                out = self._encode(
                    ids, cu, tiles, n_b, max(max_len, length_class(max_len, bool(self.tile_block), self.max_positions))
                )
                self.eager_runs += 1
            self._host_out[:n].copy_(out[:n], non_blocking=True)
            self._wait()
        return self._host_out[:n].numpy().copy()

    def _wait(self) -> None:
        """Until the stream's work is done: poll for up to spin_s, then sleep on the (blocking-sync) event."""
        if self.spin_s < 0:
            self.stream.synchronize()
            return
        done = self._done
        done.record(self.stream)
        deadline = time.perf_counter() + self.spin_s
        while not done.query():
            if time.perf_counter() >= deadline:
                done.synchronize()
                return

    def _capture(self, key):
        t_b, n_b, len_class = key
        size = layout_size(t_b, n_b, self.tile_block)
        ids, cu, tiles = views(self._dev_in[:size], t_b, n_b, self.tile_block)
        # One eager run first: compiles Triton kernels for these shapes and warms cuBLAS outside the capture.
        self._encode(ids, cu, tiles, n_b, len_class)
        self.stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
            out = self._encode(ids, cu, tiles, n_b, len_class)
        self._graphs[key] = (g, out)
        self.graph_captures += 1
        return self._graphs[key]

    def warmup(self, shapes) -> None:
        """Captures graphs ahead of traffic: shapes is an iterable of (tokens, sequences) pairs."""
        for tokens, seqs in shapes:
            per = max(1, tokens // seqs)
            self.forward([np.full(per, 100, dtype=np.int32) for _ in range(seqs)])
