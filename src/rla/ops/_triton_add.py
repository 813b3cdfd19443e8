"""The ``fp32_carry`` residual add in Triton: out = RN((x + r) + m), one read of each input.

Under ``residual_stream='fp32_carry'`` the MLP's residual add reads the attention's unrounded sum
x + r (Inductor recomputes it in the consumer kernel). Recomputing it here from the two lp tensors
costs nothing but their reads: the kernel reads x, r and m once, adds in fp32 in that order and
writes the result once (in lp, or fp32 when the next norm reads the fp32 sum). No fp32 copy of
x + r lives across the MLP. The backward of an add is the identity: d_x = d_r = d_m = d_out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv

BLOCK, WARPS = 2048, 4


@triton.jit
def _add3_kernel(x_ptr, r_ptr, m_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(o_ptr + offs, ((x + r) + m).to(o_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, r: torch.Tensor, m: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    x, r, m = x.contiguous(), r.contiguous(), m.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.numel()
    if n:
        _add3_kernel[(cdiv(n, BLOCK),)](x, r, m, out, n, BLOCK=BLOCK, num_warps=WARPS, **LAUNCH_OPTS)
    return out
