"""GPT-OSS's clamped SwiGLU in Triton: out = (clamp(u, -l, l) + 1) * g * sigmoid(alpha * g) with
g = clamp(gate, max=l), rounded where the profile says (``swiglu``); fp32 backward.

Elementwise over the flattened tensors, one block of ``BLOCK`` elements per program, as
``_triton_swiglu``. ``gate`` / ``up`` may arrive as the strided halves of GPT-OSS's interleaved
``gate_up`` (``x[..., ::2]``, ``x[..., 1::2]``): they are made contiguous first (one copy each).

Numerics: the kernels must equal ``rla.ops.reference.swiglu_oai`` bit for bit on CUDA, a chain of
PyTorch ops, one CUDA kernel each, so every step here is one IEEE operation
(``enable_fp_fusion=False``): sigmoid(t) = 1 / (1 + exp(-t)) with libdevice ``expf`` and an IEEE
division (PyTorch's CUDA sigmoid); clamps propagate NaN as ``torch.clamp`` does.

- ``per_op`` (HF's op sequence on lp tensors): RN(RN(u) + 1) * RN(g * RN(sigmoid(RN(g * alpha)))),
  rounded once more at the store; ``fused`` under ``oai_glu='sigmoid'``: RN((u + 1) * (g * sigmoid(g *
  alpha))); under ``quotient``: RN((g * (u + 1)) / (1 + exp(-(g * alpha)))), one IEEE division (vLLM's
  ``swigluoai_and_mul`` kernel: its ``1 + e`` is one FFMA of expf's exact power-of-two scale, the same value).
- backward: ``sig = sigmoid(g * alpha)``; d_gate = RN(dy * (gate <= l ? (u + 1) * (sig + ((g *
  alpha) * sig) * (1 - sig)) : 0)); d_up = RN(dy * (-l <= up <= l ? g * sig : 0)) -- the
  reference's ``torch.where``, so a zeroed gradient keeps the sign of ``dy * 0``.

``alpha`` and ``limit`` are fp32 kernel arguments, as PyTorch casts a Python scalar for an fp32
tensor's op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, div_rn, exp

FWD_BLOCK, FWD_WARPS = 2048, 4
BWD_BLOCK, BWD_WARPS = 2048, 8
"""Launch parameters: SwiGLU's (``_triton_swiglu``, tuned on an H200), the same memory-bound shape."""


@triton.jit
def _sigmoid(t):
    return div_rn(1.0, 1.0 + exp(-t))


@triton.jit
def _clamped(gr, ur, limit):
    g = tl.minimum(gr, limit, propagate_nan=tl.PropagateNan.ALL)
    u = tl.maximum(tl.minimum(ur, limit, propagate_nan=tl.PropagateNan.ALL), -limit, propagate_nan=tl.PropagateNan.ALL)
    return g, u


@triton.jit
def _oai_fwd_kernel(g_ptr, u_ptr, o_ptr, n, alpha, limit, PER_OP: tl.constexpr, QUOTIENT: tl.constexpr,
                    BLOCK: tl.constexpr):
    lp: tl.constexpr = o_ptr.dtype.element_ty
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gr = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    ur = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g, u = _clamped(gr, ur, limit)
    if PER_OP:
        t = (g * alpha).to(lp).to(tl.float32)
        glu = (g * _sigmoid(t).to(lp).to(tl.float32)).to(lp).to(tl.float32)
        out = (u + 1.0).to(lp).to(tl.float32) * glu
    elif QUOTIENT:
        out = div_rn(g * (u + 1.0), 1.0 + exp(-(g * alpha)))
    else:
        out = (u + 1.0) * (g * _sigmoid(g * alpha))
    tl.store(o_ptr + offs, out.to(lp), mask=mask)


@triton.jit
def _oai_bwd_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, alpha, limit, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    gr = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    ur = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g, u = _clamped(gr, ur, limit)
    sig = _sigmoid(g * alpha)
    d = (u + 1.0) * (sig + ((g * alpha) * sig) * (1.0 - sig))
    tl.store(dg_ptr + offs, (dy * tl.where(gr <= limit, d, 0.0)).to(dg_ptr.dtype.element_ty), mask=mask)
    inside = (ur >= -limit) & (ur <= limit)
    tl.store(du_ptr + offs, (dy * tl.where(inside, g * sig, 0.0)).to(du_ptr.dtype.element_ty), mask=mask)


def forward(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float, per_op: bool,
            quotient: bool = False) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n:
        _oai_fwd_kernel[(cdiv(n, FWD_BLOCK),)](
            gate, up, out, n, float(alpha), float(limit), PER_OP=per_op, QUOTIENT=quotient, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS,
            **LAUNCH_OPTS,
        )
    return out


def backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float):
    dy, gate, up = dy.contiguous(), gate.contiguous(), up.contiguous()
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    n = gate.numel()
    if n:
        _oai_bwd_kernel[(cdiv(n, BWD_BLOCK),)](
            dy, gate, up, dg, du, n, float(alpha), float(limit), BLOCK=BWD_BLOCK, num_warps=BWD_WARPS, **LAUNCH_OPTS,
        )
    return dg, du
