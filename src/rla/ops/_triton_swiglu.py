"""SwiGLU in Triton: out = silu(gate) * up, rounded where the profile says; fp32 backward.

Elementwise over the flattened (contiguous) tensors, one block of ``BLOCK`` elements per program.
Bytes: forward reads gate and up and writes out (3 lp elements per element); backward reads
gate, up and dy and writes d_gate and d_up (5). Nothing is saved but the inputs.

Numerics (docs/rounding.md, ``swiglu``): silu(g) = g / (1 + exp(-g)) with libdevice ``expf`` and an
IEEE division, exactly PyTorch's CUDA ``F.silu`` on fp32; per_op rounds it to lp before the
product, fused does not; one rounding at the store. The backward mirrors the reference
(``sig * (1 + g * (1 - sig))``), one IEEE op at a time, each gradient rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, div_rn, exp

#: Launch parameters (lab/bench/tune_fused.py, H200, 16384 x 18944 bf16): elements per program
#: and warps, forward and backward.
FWD_BLOCK, FWD_WARPS = 2048, 4
BWD_BLOCK, BWD_WARPS = 2048, 8


@triton.jit
def _swiglu_fwd_kernel(g_ptr, u_ptr, o_ptr, n, PER_OP: tl.constexpr, BLOCK: tl.constexpr):
    lp: tl.constexpr = o_ptr.dtype.element_ty
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    a = div_rn(g, 1.0 + exp(-g))
    if PER_OP:
        a = a.to(lp).to(tl.float32)
    tl.store(o_ptr + offs, (a * u).to(lp), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    sig = div_rn(1.0, 1.0 + exp(-g))
    silu = g * sig
    dsilu = sig * (1.0 + g * (1.0 - sig))
    tl.store(dg_ptr + offs, (dy * u * dsilu).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * silu).to(du_ptr.dtype.element_ty), mask=mask)


def forward(gate: torch.Tensor, up: torch.Tensor, per_op: bool) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n:
        _swiglu_fwd_kernel[(cdiv(n, FWD_BLOCK),)](
            gate, up, out, n, PER_OP=per_op, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS, **LAUNCH_OPTS
        )
    return out


def backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
    dy, gate, up = dy.contiguous(), gate.contiguous(), up.contiguous()
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    n = gate.numel()
    if n:
        _swiglu_bwd_kernel[(cdiv(n, BWD_BLOCK),)](
            dy, gate, up, dg, du, n, BLOCK=BWD_BLOCK, num_warps=BWD_WARPS, **LAUNCH_OPTS
        )
    return dg, du
