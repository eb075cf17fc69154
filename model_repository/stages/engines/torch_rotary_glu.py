"""OpenAI Triton kernels of the rotary-position and gated-FFN blocks (ModernBERT's; torch_ops.TorchOps.rotary and
TorchOps.glu_ffn launch them), and their torch twins, which the engine runs where the kernels do not.

Rows are tokens of the packed stream. The grids:
  rotary_kernel   (row blocks,)      QKV [T, 3 * hidden]: each head's q and k rotated in place by the token's position
  glu_kernel      (element blocks,)  H [T, 2 * INTER] = [input | gate] -> OUT [T, INTER] = act(input) * gate
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .torch_kernels import HAVE_TRITON, tl, triton

GLU_ACTIVATIONS = ("gelu", "gelu_tanh", "relu")  # glu_kernel's ACT codes, in this order (gelu: erf)

if HAVE_TRITON:

    @triton.jit
    def rotary_kernel(
        QKV, POS, COS, SIN, n_rows, stride, HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        """Rotate-half RoPE of q and k in place, in fp32: each head's halves (x1, x2) become (x1 cos - x2 sin,
        x2 cos + x1 sin), cos and sin [positions, HALF] read at the token's place in its sequence. PAIRS: the
        (x1, x2) pairs of a row's q and k (its hidden size); they lie first in the row, head after head."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        pairs = tl.arange(0, BLOCK_P)
        rmask = rows < n_rows
        mask = rmask[:, None] & (pairs < PAIRS)[None, :]
        pos = tl.load(POS + rows, mask=rmask, other=0).to(tl.int64)
        slot = pairs % HALF
        table = pos[:, None] * HALF + slot[None, :]
        c = tl.load(COS + table, mask=mask, other=0.0)
        s = tl.load(SIN + table, mask=mask, other=0.0)
        first = QKV + rows.to(tl.int64)[:, None] * stride + ((pairs // HALF) * (2 * HALF) + slot)[None, :]
        x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
        tl.store(first, (x1 * c - x2 * s).to(QKV.dtype.element_ty), mask=mask)
        tl.store(first + HALF, (x2 * c + x1 * s).to(QKV.dtype.element_ty), mask=mask)

    @triton.jit
    def glu_kernel(H, OUT, n_elements, INTER: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr):
        """OUT <- act(input) * gate of each row of H = [input | gate] (the up projection, its bias added by the
        GEMM), in fp32: one read of H and one write of OUT. ACT: 0 GELU (erf), 1 GELU (tanh), 2 ReLU."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        src = offs + (offs // INTER) * INTER  # row * 2 * INTER + column
        x = tl.load(H + src, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(H + src + INTER, mask=mask, other=0.0).to(tl.float32)
        if ACT == 0:
            y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        elif ACT == 1:
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            y = 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
        else:
            y = tl.maximum(x, 0.0)
        tl.store(OUT + offs, (y * gate).to(OUT.dtype.element_ty), mask=mask)
else:
    rotary_kernel = glu_kernel = None


def torch_rotary(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """rotary_kernel in torch ops: q and k of qkv [T, 3 * hidden] rotated in place, in fp32."""
    half = cos.shape[1]
    qk = qkv[:, : 2 * (qkv.shape[1] // 3)].unflatten(1, (-1, 2, half))  # [T, 2 * heads, halves, half], a view
    c, s = cos[pos.long()][:, None], sin[pos.long()][:, None]
    x1, x2 = qk[:, :, 0].float(), qk[:, :, 1].float()
    first, second = x1 * c - x2 * s, x2 * c + x1 * s  # both computed before either half is overwritten
    qk[:, :, 0], qk[:, :, 1] = first, second


def torch_glu(h: torch.Tensor, activation: str) -> torch.Tensor:
    """glu_kernel in torch ops: act(input) * gate of h = [input | gate]."""
    x, gate = h.chunk(2, dim=-1)
    if activation == "relu":
        return F.relu(x) * gate
    return F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none") * gate
