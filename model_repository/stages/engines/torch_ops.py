"""The building blocks every architecture's forward is made of (models/), on one packed token stream, each with
the engine's choice of implementation: OpenAI Triton kernels (torch_kernels.py, torch_attention.py) or torch
ops, the attention kind, GELU in the GEMM's epilogue, the residual in the GEMM.

A block takes the model's own sizes from its tensors, so one TorchOps serves whatever architecture it is given.
Activations are in the compute dtype; LayerNorm statistics, softmax, pooling and heads in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .torch_attention import grid_attention, kernel_attention, with_zero_row
from .torch_kernels import (
    add_ln_kernel,
    embed_ln_kernel,
    gelu_kernel,
    pool_kernel,
    torch_add_ln,
    torch_gelu,
    triton,
)
from .torch_layout import ID_MASK, TYPE_SHIFT, next_pow2
from .torch_rotary_glu import GLU_ACTIVATIONS, glu_kernel, rotary_kernel, torch_glu, torch_rotary

POOL_MODES = {"mean": 0, "cls": 1, "max": 2, "mean_sqrt_len": 3}
ACTIVATIONS = ("gelu", "gelu_tanh", "relu")  # what ffn_up applies (gelu: erf)


@dataclass
class PackedBatch:
    """One batch on the device: every sequence's tokens one after another (a graph bucket's tail tokens last,
    in no sequence), and where each sequence starts."""

    ids: torch.Tensor  # int32 [T]; a pair model's ids carry their token type from TYPE_SHIFT up
    cu: torch.Tensor  # int32 [n_seqs + 1]: cu_seqlens, the tail tokens past cu[-1]
    tiles: object  # (tile_seq, tile_m) for the Triton attention, a list of CPU chunks (cpu_chunks), or None
    n_seqs: int
    max_len: int  # the longest sequence the grid attention pads to
    seg: torch.Tensor  # int32 [T]: each token's sequence (n_seqs for the tail)
    pos: torch.Tensor  # int32 [T]: each token's place in its sequence
    # int32 [n_seqs + 1]: how many of each sequence's first tokens are keys (0: the tail); None: all of them
    keys: torch.Tensor | None = None

    def key_slots(self) -> torch.Tensor:
        """bool [T + 1]: whether each token is a key, then False for a grid's padding slots (with_zero_row's)."""
        is_key = self.pos < self.keys.index_select(0, self.seg)
        return torch.cat([is_key, is_key.new_zeros(1)])


class Norm:
    """A LayerNorm's parameters in fp32 (the kernels) and in the compute dtype (torch ops); no bias: zeros."""

    __slots__ = ("bias", "bias_t", "eps", "weight", "weight_t")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, dtype: torch.dtype) -> None:
        self.weight = weight.float().contiguous()
        self.bias = torch.zeros_like(self.weight) if bias is None else bias.float().contiguous()
        self.weight_t, self.bias_t = self.weight.to(dtype), self.bias.to(dtype)
        self.eps = eps


class TorchOps:
    """The engine's implementation choices, and the blocks that follow them."""

    def __init__(self, dtype, gemm_bf16: bool, kernels: str, attention: str, gelu: str, residual_gemm: bool, launch):
        self.dtype = dtype
        self.gemm_bf16 = gemm_bf16  # CPU: GEMM operands rounded to bf16 (AMX), everything else fp32
        self.kernels = kernels  # triton | torch | compile
        self.attention = attention  # triton | flash | varlen | sdpa
        self.gelu = gelu  # exact | tanh_epilogue
        self.residual_gemm = residual_gemm
        self.launch = launch  # the Triton attention's (BLOCK_M, BLOCK_N, warps, stages)
        if kernels == "compile":
            self._add_ln_compiled = torch.compile(torch_add_ln, dynamic=True)
            self._gelu_compiled = torch.compile(torch_gelu, dynamic=True)

    # ------------------------------------------------------------------------------------------------------
    def embed(self, batch: PackedBatch, word, positions, types, norm: Norm, pairs: bool, pos_offset: int = 0):
        """LayerNorm(word [+ position] + token type embedding) of every token. positions None: none (rotary);
        types: the [types, hidden] table (pairs) or type 0's row; pos_offset: where a sequence's positions start."""
        ids, pos = batch.ids, batch.pos
        n, hidden = ids.shape[0], word.shape[1]
        if self.kernels == "triton":
            out = torch.empty((n, hidden), device=ids.device, dtype=self.dtype)
            embed_ln_kernel[(triton.cdiv(n, 4),)](
                ids, pos, word, word if positions is None else positions, types, norm.weight, norm.bias, out, n,
                norm.eps, pos_offset, PAIRS=pairs, SHIFT=TYPE_SHIFT, HAS_POS=positions is not None,
                HIDDEN=hidden, BLOCK_H=next_pow2(hidden), BLOCK_R=4, num_warps=4,
            )  # fmt: skip
            return out
        ids = ids.long()
        if pairs:
            x = F.embedding(ids & ID_MASK, word) + F.embedding(ids >> TYPE_SHIFT, types)
        else:
            x = F.embedding(ids, word) + types
        if positions is not None:
            x = x + F.embedding(pos.long() + pos_offset, positions)
        return F.layer_norm(x, (hidden,), norm.weight_t, norm.bias_t, norm.eps)

    def add_ln(self, y, res, bias, norm: Norm, out=None) -> torch.Tensor:
        """LayerNorm(y [+ res] [+ bias]), into out (default: y itself)."""
        if self.kernels == "triton":
            n, hidden = y.shape
            out = y if out is None else out
            add_ln_kernel[(triton.cdiv(n, 4),)](
                y, y if res is None else res, y if bias is None else bias, norm.weight, norm.bias, out, n, norm.eps,
                HAS_RES=res is not None, HAS_BIAS=bias is not None,
                HIDDEN=hidden, BLOCK_H=next_pow2(hidden), BLOCK_R=4, num_warps=4,
            )  # fmt: skip
            return out
        if res is None and bias is None:
            return F.layer_norm(y, (y.shape[1],), norm.weight_t, norm.bias_t, norm.eps)
        other = res if bias is None else (bias if res is None else res + bias)
        fn = self._add_ln_compiled if self.kernels == "compile" else torch_add_ln
        return fn(y, other, norm.weight_t, norm.bias_t, norm.eps)

    def norm(self, x, norm: Norm) -> torch.Tensor:
        """LayerNorm(x) into a new tensor (a pre-norm layer keeps x as its residual)."""
        return self.add_ln(x, None, None, norm, out=torch.empty_like(x))

    def linear(self, x, weight, bias=None) -> torch.Tensor:
        """x @ weight^T (+ bias); CPU bf16: the operands rounded to bf16 (AMX tiles), the bias added in fp32."""
        if self.gemm_bf16:
            y = F.linear(x.to(torch.bfloat16), weight).float()
            return y if bias is None else y.add_(bias)
        return F.linear(x, weight, bias)

    def proj_add(self, inp, weight, x) -> torch.Tensor:
        """x += inp @ weight^T, in place (a pre-norm layer's residual; cuBLAS beta=1)."""
        if self.gemm_bf16:
            return x.add_(self.linear(inp, weight))
        return x.addmm_(inp, weight.t())

    def proj_add_ln(self, inp, weight, bias, x, norm: Norm) -> torch.Tensor:
        """LayerNorm(x + inp @ weight^T + bias), a post-norm layer's residual: the residual rides in the GEMM
        (x += inp @ W^T, cuBLAS beta=1) and the bias in the LayerNorm kernel, or the bias in the GEMM epilogue
        and the residual in the kernel."""
        if self.residual_gemm and not self.gemm_bf16:
            return self.add_ln(x.addmm_(inp, weight.t()), None, bias, norm)
        return self.add_ln(self.linear(inp, weight, bias), x, None, norm)

    def ffn_up(self, x, weight, bias, activation: str) -> torch.Tensor:
        """activation(x @ weight^T + bias): gelu (erf; on a GPU in fp16/bf16 the cuBLASLt epilogue's tanh GELU
        when gelu = tanh_epilogue), gelu_tanh or relu (the epilogue's too)."""
        if activation == "relu" and self.gelu == "tanh_epilogue":
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=False)
        if activation != "relu" and self.gelu == "tanh_epilogue":
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        h = self.linear(x, weight, bias)
        if activation == "relu":
            return F.relu_(h)
        tanh = activation == "gelu_tanh"
        if self.kernels == "triton":
            n = h.numel()
            gelu_kernel[(triton.cdiv(n, 2048),)](h, n, TANH=tanh, BLOCK=2048, num_warps=8)
            return h
        if self.kernels == "compile":
            return self._gelu_compiled(h, tanh)
        return torch_gelu(h, tanh)

    def glu_ffn(self, x, weight, bias, activation: str) -> torch.Tensor:
        """act(input) * gate of the up projection x @ weight^T + bias = [input | gate] (GeGLU): [T, intermediate].
        The kernel reads the projection once and writes the half-width result (the torch ops take two passes)."""
        h = self.linear(x, weight, bias)
        if self.kernels != "triton":
            return torch_glu(h, activation)
        n, inter = h.shape[0], h.shape[1] // 2
        out = torch.empty((n, inter), device=h.device, dtype=h.dtype)
        glu_kernel[(triton.cdiv(n * inter, 2048),)](
            h, out, n * inter, INTER=inter, ACT=GLU_ACTIVATIONS.index(activation), BLOCK=2048, num_warps=8
        )
        return out

    def rotary(self, qkv, batch: PackedBatch, cos, sin) -> None:
        """Rotates every head's q and k in the fused projection [T, 3 * hidden] in place by each token's place in its
        sequence (rotate-half RoPE, fp32 math); cos, sin: fp32 [positions, head_dim // 2]."""
        if self.kernels != "triton":
            torch_rotary(qkv, batch.pos, cos, sin)
            return
        n, hidden = qkv.shape[0], qkv.shape[1] // 3
        block_p = next_pow2(hidden)
        rows = max(1, 4096 // block_p)  # about 4096 pairs a program, whatever the hidden size
        rotary_kernel[(triton.cdiv(n, rows),)](
            qkv, batch.pos, cos, sin, n, qkv.stride(0), HALF=cos.shape[1], PAIRS=hidden, BLOCK_P=block_p,
            BLOCK_R=rows, num_warps=4,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------------
    def attend(self, qkv, batch: PackedBatch, heads: int, scale: float, bias=None, window: int = 0) -> torch.Tensor:
        """softmax(Q K^T * scale [+ bias]) V per sequence [and window] of the fused projection [T, 3 * hidden]."""
        t, hidden = qkv.shape[0], qkv.shape[1] // 3
        if self.attention == "triton":
            out = torch.empty((t, hidden), device=qkv.device, dtype=qkv.dtype)
            kernel_attention(qkv, out, batch.cu, batch.tiles, heads, scale, bias, window, self.launch, batch.keys)
            return out
        if self.attention in ("flash", "varlen"):
            if bias is not None or window or batch.keys is not None:  # the engine never asks
                raise ValueError(f"attention {self.attention!r} takes no bias, window or key lengths")
            q, k, v = qkv.view(t, 3, heads, hidden // heads).unbind(1)
            cu, longest = batch.cu, batch.max_len
            if self.attention == "flash":
                out = torch.ops.aten._flash_attention_forward(
                    q, k, v, cu, cu, longest, longest, 0.0, False, False, scale=scale
                )[0]
                return out.reshape(t, hidden)
            from torch.nn.attention.varlen import varlen_attn

            return varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale).reshape(t, hidden)
        if isinstance(batch.tiles, list):  # the CPU: a grid per chunk of sequences of similar lengths
            out = torch.empty((t, hidden), dtype=qkv.dtype)
            key_slots = None if batch.keys is None else batch.key_slots()
            for gather, real, targets in batch.tiles:
                keys = real if key_slots is None else key_slots.index_select(0, gather).view(real.shape) & real
                o = grid_attention(qkv, gather, keys, heads, scale, bias, window)
                out.index_copy_(0, targets, o[real.reshape(-1)])
            return out
        # One grid [n_seqs + 1, max_len] for the whole batch (the extra row takes a bucket's tail tokens).
        width = batch.max_len
        slot = batch.seg.long() * width + batch.pos.long()
        gather = torch.full(((batch.n_seqs + 1) * width,), t, device=qkv.device, dtype=torch.long)
        gather.index_copy_(0, slot, torch.arange(t, device=qkv.device))
        real = (gather < t) if batch.keys is None else batch.key_slots().index_select(0, gather)
        real = real.view(batch.n_seqs + 1, width)
        real[:, 0] = True  # an empty row attends to one zero key instead of producing NaN
        o = grid_attention(with_zero_row(qkv), gather, real, heads, scale, bias, window)
        return o.index_select(0, slot)

    # ------------------------------------------------------------------------------------------------------
    def pool(self, x, batch: PackedBatch, mode: str, normalize: bool) -> torch.Tensor:
        """fp32 [n_seqs, hidden]: each sequence's tokens pooled as sentence-transformers' Pooling (+ Normalize)."""
        n_seqs, hidden, cu = batch.n_seqs, x.shape[1], batch.cu
        code = POOL_MODES[mode]
        if self.kernels == "triton":
            out = torch.empty((n_seqs, hidden), device=x.device, dtype=torch.float32)
            pool_kernel[(n_seqs,)](
                x, cu, out, HIDDEN=hidden, MODE=code, NORMALIZE=bool(normalize), BLOCK_T=16,
                BLOCK_H=next_pow2(hidden), num_warps=4,
            )  # fmt: skip
            return out
        lens = (cu[1:] - cu[:-1]).float().clamp(min=1.0)[:, None]
        seg = batch.seg.long()
        if code == 1:
            first = cu[:-1].long().clamp(max=x.shape[0] - 1)
            pooled = x.index_select(0, first).float() * (cu[1:] > cu[:-1])[:, None]
        elif code == 2:
            pooled = torch.full((n_seqs + 1, hidden), float("-inf"), device=x.device, dtype=torch.float32)
            pooled.scatter_reduce_(0, seg[:, None].expand(-1, hidden), x.float(), "amax")
            pooled = pooled[:n_seqs]
            pooled = torch.where(torch.isinf(pooled), torch.zeros_like(pooled), pooled)
        else:
            sums = torch.zeros((n_seqs + 1, hidden), device=x.device, dtype=torch.float32)
            sums.index_add_(0, seg, x.float())
            pooled = sums[:n_seqs] / (lens if code == 0 else lens.sqrt())
        if normalize:
            pooled = F.normalize(pooled, p=2.0, dim=-1, eps=1e-12)
        return pooled


def packed_batch(ids: torch.Tensor, cu: torch.Tensor, tiles, n_seqs: int, max_len: int, keys=None) -> PackedBatch:
    """The PackedBatch of a packed stream: each token's sequence (n_seqs for the tail past cu[-1]) and place in it."""
    ar = torch.arange(ids.shape[0], device=ids.device, dtype=torch.int32)
    seg = torch.searchsorted(cu[1:], ar, right=True, out_int32=True)
    pos = torch.where(seg < n_seqs, ar - cu.index_select(0, seg), 0)
    return PackedBatch(ids, cu, tiles, n_seqs, max_len, seg, pos, keys)
