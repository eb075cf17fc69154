"""The OpenAI Triton kernel of the torch engine's sparse head (torch_sparse.py): each sequence's max of one chunk
of the vocabulary's logits, floored at 0 (the relu of SpladePooling, which commutes with the max).

  segment_max_kernel   (sequences, column blocks)   LOGITS [tokens, WIDTH], CU (cu_seqlens)
                                                    -> OUT[sequence, FIRST + column] (OUT [sequences, vocabulary])

A graph bucket's tail tokens lie past CU[-1] and are read by no program.
"""

from __future__ import annotations

from .torch_kernels import HAVE_TRITON, tl, triton

if HAVE_TRITON:

    @triton.jit
    def segment_max_kernel(
        LOGITS, CU, OUT, width, out_stride, first, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        seq = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = cols < width
        start = tl.load(CU + seq).to(tl.int64)
        end = tl.load(CU + seq + 1).to(tl.int64)
        acc = tl.zeros([BLOCK_C], tl.float32)  # the relu: a max of 0 at least
        for t0 in range(start, end, BLOCK_T):
            rows = t0 + tl.arange(0, BLOCK_T)
            mask = (rows < end)[:, None] & cmask[None, :]
            x = tl.load(LOGITS + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
            acc = tl.maximum(acc, tl.max(x.to(tl.float32), 0))
        tl.store(OUT + seq.to(tl.int64) * out_stride + first + cols, acc, mask=cmask)
else:
    segment_max_kernel = None
