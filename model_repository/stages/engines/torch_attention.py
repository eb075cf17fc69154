"""Attention over the packed token stream: the OpenAI Triton varlen kernel, and the padded-grid SDPA the CPU (and
any GPU the kernel cannot serve) runs. Both take what the architectures add to plain softmax(Q K^T) V:

  bias    a per-head additive bias by relative position, [heads, 2 * positions - 1] fp32, read at
          (key - query) + positions - 1 (MPNet's bucketed relative positions, looked up once at load)
  window  keys further than this from the query are masked (ModernBERT's local layers); 0: none
  keys    per sequence, how many of its first tokens are keys (a multi-vector query's unattended expansion, its
          last tokens, gets a row but is a key to none); None: all of them

The kernel runs on a grid of (query tiles, heads); the tile table (torch_layout.pack) lists (sequence, first
query row) pairs, -1 for unused slots. QKV is the fused projection [T, 3 * HIDDEN] (q | k | v, heads contiguous
inside each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .torch_kernels import HAVE_TRITON, tl, triton

LOG2E = 1.4426950408889634  # the kernel's softmax runs on exp2

if HAVE_TRITON:

    @triton.jit
    def varlen_attn_kernel(
        QKV, OUT, CU, KEYS, TILE_SEQ, TILE_M, BIAS, qk_scale, stride_qkv, stride_o, bias_stride, bias_center,
        HIDDEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_BIAS: tl.constexpr, WINDOW: tl.constexpr, HAS_KEYS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        """One (query tile, head): softmax(Q K^T * scale + bias) V over its own sequence's keys (and window)."""
        tile = tl.program_id(0)
        head = tl.program_id(1)
        seq = tl.load(TILE_SEQ + tile)
        if seq < 0:
            return
        m0 = tl.load(TILE_M + tile)
        start = tl.load(CU + seq)
        seqlen = tl.load(CU + seq + 1) - start
        keylen = seqlen
        if HAS_KEYS:  # a constexpr branch: without key lengths the kernel is the one it always was
            keylen = tl.load(KEYS + seq)
        start = start.to(tl.int64)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        mask_m = offs_m < seqlen
        col = head * HEAD_DIM + offs_d[None, :]
        q = tl.load(QKV + (start + offs_m)[:, None] * stride_qkv + col, mask=mask_m[:, None], other=0.0)
        # Finite: with a window, a row's first key blocks can all lie outside it (-inf - -inf would be NaN).
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        lo = 0
        hi = keylen
        if WINDOW > 0:  # only the key blocks some query of this tile can see
            lo = tl.maximum(m0 - WINDOW, 0) // BLOCK_N * BLOCK_N
            hi = tl.minimum(m0 + BLOCK_M + WINDOW, keylen)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < keylen
            rows = (start + offs_n)[:, None] * stride_qkv + col
            k = tl.load(QKV + HIDDEN + rows, mask=mask_n[:, None], other=0.0)
            v = tl.load(QKV + 2 * HIDDEN + rows, mask=mask_n[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            relative = offs_n[None, :] - offs_m[:, None]
            if HAS_BIAS:
                keep = mask_m[:, None] & mask_n[None, :]
                bias = tl.load(BIAS + head * bias_stride + relative + bias_center, mask=keep, other=0.0)
                s += bias * 1.4426950408889634
            visible = mask_n[None, :]
            if WINDOW > 0:  # a query row past the sequence keeps its keys: no row is all -inf
                visible = visible & ((tl.abs(relative) <= WINDOW) | (offs_m[:, None] >= seqlen))
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        acc = acc / l_i[:, None]
        out = OUT + (start + offs_m)[:, None] * stride_o + col
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=mask_m[:, None])
else:
    varlen_attn_kernel = None


def kernel_attention(qkv, out, cu, tiles, heads: int, scale: float, bias, window: int, launch: tuple, keys) -> None:
    """Runs the Triton kernel: launch is (BLOCK_M, BLOCK_N, warps, stages); keys: int32 key lengths or None."""
    block_m, block_n, warps, stages = launch
    tile_seq, tile_m = tiles
    hidden = out.shape[1]
    varlen_attn_kernel[(tile_seq.shape[0], heads)](
        qkv, out, cu, cu if keys is None else keys, tile_seq, tile_m, qkv if bias is None else bias, scale * LOG2E,
        qkv.stride(0), out.stride(0),
        0 if bias is None else bias.stride(0), 0 if bias is None else (bias.shape[1] - 1) // 2,
        HIDDEN=hidden, HEAD_DIM=hidden // heads, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_BIAS=bias is not None, WINDOW=window, HAS_KEYS=keys is not None, num_warps=warps, num_stages=stages,
        DOT_PRECISION=dot_precision(qkv.dtype),
    )  # fmt: skip


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands multiply in IEEE fp32, as torch's own fp32 matmuls do (allow_tf32 is off): Triton's default,
    TF32, keeps 10 mantissa bits and would make an fp32 engine an fp16-like one (a SPLADE's term order: issue 44).
    Half-precision operands ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def grid_mask(real: torch.Tensor, bias: torch.Tensor | None, window: int) -> torch.Tensor:
    """The SDPA mask of a padded grid [rows, width] whose row r, slot j is token j of a sequence (real: which
    slots hold a key): bool [rows, 1, 1, width] without bias or window, else [rows, heads or 1, width, width]
    (float with the bias). A query slot sees its sequence's real keys within the window."""
    width = real.shape[1]
    keys = real[:, None, None, :]
    if bias is None and not window:
        return keys
    if window:  # the band |key - query| <= window, built in bool (an int64 distance grid is 0.5 GB at 8,192)
        band = torch.ones((width, width), dtype=torch.bool, device=real.device).triu_(-window).tril_(window)
        keys = keys & band[None, None]
    if bias is None:
        return keys
    position = torch.arange(width, device=real.device)
    relative = position[None, :] - position[:, None]  # [query, key]
    center = (bias.shape[1] - 1) // 2
    values = bias[:, relative + center]  # [heads, width, width]
    return torch.where(keys, values[None].to(torch.float32), float("-inf"))


def with_zero_row(qkv: torch.Tensor) -> torch.Tensor:
    """The packed rows and one zero row after them: what a grid's padding slots read."""
    return torch.cat([qkv, qkv.new_zeros((1, qkv.shape[1]))])


def grid_attention(padded, gather, real, heads: int, scale: float, bias, window: int) -> torch.Tensor:
    """softmax(Q K^T * scale + bias) V of the packed rows gathered into a padded grid (padded: the packed QKV,
    or its with_zero_row; gather: the row of each slot; real: which slots are keys): [rows * width, hidden],
    padding slots included."""
    rows, width = real.shape
    hidden = padded.shape[1] // 3
    grid = padded.index_select(0, gather).view(rows, width, 3, heads, hidden // heads)
    q, k, v = grid.permute(2, 0, 3, 1, 4)
    mask = grid_mask(real, bias, window)
    if mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return o.transpose(1, 2).reshape(rows * width, hidden)
