"""OpenAI Triton kernels of the torch engine's row-wise blocks (torch_ops.py launches them), and torch twins.

The one place OpenAI Triton is imported, guarded: without it (a CPU-only torch) HAVE_TRITON is False, every
kernel name is None and the engine uses torch ops (also when the kernels fail its start-up check; the
torch_add_ln and torch_gelu below are two of them). The attention kernel is in torch_attention.py. Rows are
tokens of the packed stream; HIDDEN is the hidden size, BLOCK_H its next power of two. The grids:
  embed_ln_kernel      (row blocks,)       ids, positions -> LayerNorm(word [+ position] + token type embedding)
  add_ln_kernel        (row blocks,)       OUT <- LayerNorm(Y [+ R] [+ BIAS]) (OUT may be Y)
  gelu_kernel          (element blocks,)   X <- GELU(X) in place, erf or tanh
  pool_kernel          (sequences,)        X [tokens, HIDDEN], CU (cu_seqlens) -> OUT [sequences, HIDDEN]
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

from .base import pack_sequences
from .torch_layout import length_class

log = logging.getLogger(__name__)

try:  # OpenAI Triton: optional. Without it (or if its kernels fail the start-up check) torch ops are used.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    HAVE_TRITON = False

if HAVE_TRITON:

    @triton.jit
    def layer_norm_rows(x, G, B, cols, mask, cmask, eps, HIDDEN: tl.constexpr):
        """LayerNorm of each row of the fp32 block x (masked columns ignored), with gain G and bias B."""
        mean = tl.sum(x, axis=1) / HIDDEN
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / HIDDEN + eps)
        g = tl.load(G + cols, mask=cmask, other=0.0)
        b = tl.load(B + cols, mask=cmask, other=0.0)
        return xc * rstd[:, None] * g[None, :] + b[None, :]

    @triton.jit
    def row_block(n_rows, HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
        """This program's BLOCK_R rows and the BLOCK_H columns, with their masks (rows, cols and both)."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_H)
        rmask = rows < n_rows
        cmask = cols < HIDDEN
        return rows, cols, rmask, cmask, rmask[:, None] & cmask[None, :]

    @triton.jit
    def embed_ln_kernel(
        IDS, POS, WORD, POSW, TYPES, G, B, OUT, n_rows, eps, pos_offset,
        PAIRS: tl.constexpr, SHIFT: tl.constexpr, HAS_POS: tl.constexpr,
        HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        """OUT <- LayerNorm(word + position + token type embeddings). PAIRS: each id carries its token's type in
        the bits from SHIFT up, and TYPES is the [types, HIDDEN] table; else TYPES is type 0's row. A token's
        position row is its place in its sequence plus pos_offset (RoBERTa's start after the padding id);
        HAS_POS false: no position embeddings (rotary models)."""
        rows, cols, rmask, cmask, mask = row_block(n_rows, HIDDEN, BLOCK_H, BLOCK_R)
        ids = tl.load(IDS + rows, mask=rmask, other=0).to(tl.int64)
        pos = tl.load(POS + rows, mask=rmask, other=0).to(tl.int64)
        if PAIRS:
            kinds = ids >> SHIFT
            ids = ids & ((1 << SHIFT) - 1)
            x = tl.load(TYPES + kinds[:, None] * HIDDEN + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
            x += tl.load(TYPES + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        x += tl.load(WORD + ids[:, None] * HIDDEN + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_POS:
            pos += pos_offset
            x += tl.load(POSW + pos[:, None] * HIDDEN + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = layer_norm_rows(x, G, B, cols, mask, cmask, eps, HIDDEN)
        out_rows = rows.to(tl.int64)[:, None] * HIDDEN
        tl.store(OUT + out_rows + cols[None, :], y.to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def add_ln_kernel(
        Y, R, BIAS, G, B, OUT, n_rows, eps,
        HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
        HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        """OUT <- LayerNorm(Y [+ R] [+ BIAS]), statistics in fp32 (OUT may be Y: in place)."""
        rows, cols, _, cmask, mask = row_block(n_rows, HIDDEN, BLOCK_H, BLOCK_R)
        offs = rows.to(tl.int64)[:, None] * HIDDEN + cols[None, :]
        x = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            x += tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y = layer_norm_rows(x, G, B, cols, mask, cmask, eps, HIDDEN)
        tl.store(OUT + offs, y.to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def gelu_kernel(X, n_elements, TANH: tl.constexpr, BLOCK: tl.constexpr):
        """X <- GELU(X) in place (the bias was added by the GEMM epilogue), computed in fp32."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        if TANH:
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
            y = 0.5 * x * (1.0 + t)
        else:
            y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        tl.store(X + offs, y.to(X.dtype.element_ty), mask=mask)

    @triton.jit
    def pool_kernel(
        X, CU, OUT, HIDDEN: tl.constexpr, MODE: tl.constexpr, NORMALIZE: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        """One sequence: mean (0) | cls (1) | max (2) | mean_sqrt_len (3) over its own tokens, optional L2."""
        seq = tl.program_id(0)
        start = tl.load(CU + seq)
        seqlen = tl.load(CU + seq + 1) - start
        start = start.to(tl.int64)
        cols = tl.arange(0, BLOCK_H)
        cmask = cols < HIDDEN
        if MODE == 1:
            acc = tl.load(X + start * HIDDEN + cols, mask=cmask & (seqlen > 0), other=0.0).to(tl.float32)
        elif MODE == 2:
            acc = tl.full([BLOCK_H], float("-inf"), tl.float32)
            for t0 in range(0, seqlen, BLOCK_T):
                rows = t0 + tl.arange(0, BLOCK_T)
                mask = (rows < seqlen)[:, None] & cmask[None, :]
                x = tl.load(X + (start + rows)[:, None] * HIDDEN + cols[None, :], mask=mask, other=float("-inf"))
                acc = tl.maximum(acc, tl.max(x.to(tl.float32), 0))
            acc = tl.where(cmask & (seqlen > 0), acc, 0.0)
        else:
            acc = tl.zeros([BLOCK_H], tl.float32)
            for t0 in range(0, seqlen, BLOCK_T):
                rows = t0 + tl.arange(0, BLOCK_T)
                mask = (rows < seqlen)[:, None] & cmask[None, :]
                x = tl.load(X + (start + rows)[:, None] * HIDDEN + cols[None, :], mask=mask, other=0.0)
                acc += tl.sum(x.to(tl.float32), 0)
            n = tl.maximum(seqlen, 1).to(tl.float32)
            if MODE == 0:  # noqa: SIM108 (constexpr branch)
                acc = acc / n
            else:
                acc = acc / tl.sqrt(n)
        if NORMALIZE:
            norm = tl.sqrt(tl.sum(acc * acc, 0))
            acc = acc / tl.maximum(norm, 1e-12)
        tl.store(OUT + seq.to(tl.int64) * HIDDEN + cols, acc, mask=cmask)
else:
    row_block = layer_norm_rows = None
    embed_ln_kernel = add_ln_kernel = gelu_kernel = pool_kernel = None


def torch_add_ln(y: torch.Tensor, res: torch.Tensor, g: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(y + res, (y.shape[-1],), g, b, eps)


def torch_gelu(h: torch.Tensor, tanh: bool) -> torch.Tensor:
    return F.gelu(h, approximate="tanh" if tanh else "none")


class KernelCheck:
    """The engine's start-up check of these kernels (on the GPU): against the torch ops, or off."""

    @torch.inference_mode()
    def _self_check(self) -> None:
        """Runs each Triton kernel once on a small batch against the torch ops; falls back on failure."""
        rng = np.random.default_rng(0)
        vocab = int(self.model.config.get("vocab_size", 2000))  # ids past a small vocabulary would read garbage
        seqs = [rng.integers(vocab // 2, vocab, size=int(n), dtype=np.int32) for n in (7, 33, 70)]
        ops = self.ops
        wanted = (ops.kernels, ops.attention)
        plain = self.model.plain_attention and self.dtype != torch.float32
        fallback_attention = "flash" if plain else "sdpa"
        try:
            with torch.cuda.stream(self.stream):
                fast = self._eager_reference(seqs)
                ops.kernels = "torch" if ops.kernels == "triton" else ops.kernels
                ops.attention = "sdpa" if ops.attention == "triton" else ops.attention
                slow = self._eager_reference(seqs)
            cos = F.cosine_similarity(fast.float(), slow.float(), dim=-1).min().item()
            if not cos > 0.99:
                raise RuntimeError(f"Triton kernels disagree with torch ops (cosine {cos:.4f})")
            ops.kernels, ops.attention = wanted
        except Exception as exc:  # pragma: no cover - only on machines whose Triton is broken
            log.warning(
                "OpenAI Triton kernels unusable (%s); using torch ops and %s attention", exc, fallback_attention
            )
            ops.kernels = "torch" if wanted[0] == "triton" else wanted[0]
            ops.attention = fallback_attention if wanted[1] == "triton" else wanted[1]

    def _eager_reference(self, sequences) -> torch.Tensor:
        ids, lens = pack_sequences(sequences)
        longest = int(lens.max())
        out = self._encode_eager(
            ids, lens, max(longest, length_class(longest, bool(self.tile_block), self.max_positions))
        )
        torch.cuda.synchronize(self.torch_device)
        return out[-1] if isinstance(out, tuple) else out  # a hybrid model's: its token vectors
