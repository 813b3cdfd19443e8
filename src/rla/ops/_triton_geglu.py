"""GeGLU (tanh approximation) in Triton: out = gelu_tanh(gate) * up, rounded where the profile
says (``swiglu``: the gated product's point); fp32 backward. Gemma's gated MLP.

Elementwise over the flattened (contiguous) tensors, one block of ``BLOCK`` elements per program,
as ``_triton_swiglu``; bytes the same (forward 3 lp elements per element, backward 5).

Numerics: the kernels must equal ``rla.ops.reference.geglu`` bit for bit on CUDA, whose forward
is PyTorch's CUDA ``F.gelu(g, approximate='tanh')`` and whose backward is a chain of PyTorch ops,
one CUDA kernel each:

- forward: PyTorch's CUDA kernel (``GeluCUDAKernelImpl``) computes, in fp32,
  ``inner = kBeta * (x + kKappa * x_cube)`` with ``x_cube = x * x * x`` and returns
  ``0.5 * x * (1 + tanhf(inner))``; nvcc contracts ``x + kKappa * x_cube`` into one FMA (its
  default ``-fmad=true``), so the kernel writes that FMA (``tl.fma``) and every other step as one
  IEEE operation (``enable_fp_fusion=False``); ``tanhf`` is libdevice's (``_triton_common.tanh``).
  ``per_op`` rounds the activation before the product, ``fused`` does not; one rounding at the store.
- backward: the reference's expressions in its order, each operation rounded to fp32 on its own
  (separate kernels contract nothing): ``t = tanh(b * (g + ((k * g) * g) * g))``,
  ``dact = 0.5 * (1 + t) + ((0.5 * g) * (1 - t * t)) * (b * (1 + ((3k) * g) * g))``,
  ``d_gate = RN((dy * u) * dact)``; ``d_up = RN(dy * gelu(g))`` with the forward's gelu.

The constants are fp32: ``b`` = sqrt(2 / pi) (PyTorch's ``M_SQRT2 * M_2_SQRTPI * 0.5``),
``k`` = 0.044715 and ``3k`` formed in double then rounded, as the reference's Python scalars are.
Under ``TRITON_INTERPRET=1`` tanh is written with ``exp`` (no libdevice): a logic check, not bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, tanh

FWD_BLOCK, FWD_WARPS = 2048, 4
BWD_BLOCK, BWD_WARPS = 2048, 8
"""Launch parameters: SwiGLU's (``_triton_swiglu``, tuned on an H200), the same memory-bound shape."""

BETA = 0.7978845608028654
KAPPA = 0.044715
KAPPA3 = 3.0 * KAPPA


@triton.jit
def _gelu(g, BETA: tl.constexpr, KAPPA: tl.constexpr):
    inner = BETA * tl.fma(KAPPA, g * g * g, g)
    return 0.5 * g * (1.0 + tanh(inner))


@triton.jit
def _geglu_fwd_kernel(g_ptr, u_ptr, o_ptr, n, PER_OP: tl.constexpr, BETA: tl.constexpr, KAPPA: tl.constexpr,
                      BLOCK: tl.constexpr):
    lp: tl.constexpr = o_ptr.dtype.element_ty
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    a = _gelu(g, BETA, KAPPA)
    if PER_OP:
        a = a.to(lp).to(tl.float32)
    tl.store(o_ptr + offs, (a * u).to(lp), mask=mask)


@triton.jit
def _geglu_bwd_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BETA: tl.constexpr, KAPPA: tl.constexpr,
                      KAPPA3: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    t = tanh(BETA * (g + ((KAPPA * g) * g) * g))
    dact = 0.5 * (1.0 + t) + ((0.5 * g) * (1.0 - t * t)) * (BETA * (1.0 + (KAPPA3 * g) * g))
    tl.store(dg_ptr + offs, ((dy * u) * dact).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * _gelu(g, BETA, KAPPA)).to(du_ptr.dtype.element_ty), mask=mask)


def forward(gate: torch.Tensor, up: torch.Tensor, per_op: bool) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n:
        _geglu_fwd_kernel[(cdiv(n, FWD_BLOCK),)](
            gate, up, out, n, PER_OP=per_op, BETA=BETA, KAPPA=KAPPA, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS,
            **LAUNCH_OPTS,
        )
    return out


def backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
    dy, gate, up = dy.contiguous(), gate.contiguous(), up.contiguous()
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    n = gate.numel()
    if n:
        _geglu_bwd_kernel[(cdiv(n, BWD_BLOCK),)](
            dy, gate, up, dg, du, n, BETA=BETA, KAPPA=KAPPA, KAPPA3=KAPPA3, BLOCK=BWD_BLOCK, num_warps=BWD_WARPS,
            **LAUNCH_OPTS,
        )
    return dg, du
