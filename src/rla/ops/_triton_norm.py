"""RMSNorm and residual-add + RMSNorm in Triton, forward and backward.

Forward: one program per row (the hidden size fits one block: up to 64K columns). It reads x (and
the residual r), writes the normalised row (and RN(x + r)) and one fp32 rstd per row for the
backward. Backward: a persistent grid of a few programs per multiprocessor; each walks a slice of
the rows, writes d_x (for add+norm, d_x = d_r, the same tensor is handed to both inputs) and keeps
its share of d_weight in registers, summed over programs afterwards in fp32.

Numerics (ROUNDING.md, ``norm.weight`` and ``norm.residual``):
  v    = x                      (rms_norm)
       = RN(x + r) or x + r      (add_rms_norm, rounded_sum or fp32_sum; the residual handed on
                                  is RN(x + r) in both)
  rstd = rsqrt(sum(v*v) * RN(1/N) + eps)   PyTorch's ``mean`` multiplies the sum by the fp32
                                  factor 1/N; the summation order is Triton's tree, not PyTorch's,
                                  so rstd may differ from the reference by an ulp (the issue allows
                                  one lp ulp on the output)
  w    = RN(weight) when the weight is fp32 and x is not (the engine's copy), else weight
  out  = RN(w * RN(v*rstd))     (per_op)  or  RN((v*rstd) * w)  (fused)
Backward, with n = v*rstd and every rounding straight-through:
  d_v = rstd * (dy*w - n * mean(dy*w*n)) [+ d_residual],  d_w = sum over rows of dy*n.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, rsqrt, sm_count

MAX_COLS = 65536
#: Backward programs per multiprocessor (persistent grid); each keeps a d_weight row in registers.
BWD_PROGRAMS_PER_SM = 2
#: Warps per program; None picks from the block size (one warp per 512 columns, 1 to 16).
FWD_WARPS: int | None = None
BWD_WARPS: int | None = None


def _fwd_warps(block: int) -> int:
    return FWD_WARPS or max(1, min(16, block // 512))


def _bwd_warps(block: int) -> int:
    return BWD_WARPS or max(4, min(16, block // 512))


@triton.jit
def _norm_fwd_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, res_ptr, rstd_ptr,
    N, inv_n, eps, sx, sr, sy, sres,
    HAS_RES: tl.constexpr, FP32_SUM: tl.constexpr, PER_OP: tl.constexpr, ROUND_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    lp: tl.constexpr = y_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    v = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * sr + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        total = v + r
        new_res = total.to(lp)
        tl.store(res_ptr + row * sres + cols, new_res, mask=mask)
        if FP32_SUM:
            v = total
        else:
            v = new_res.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if ROUND_W:
        w = w.to(lp).to(tl.float32)
    rstd = rsqrt(tl.sum(v * v, axis=0) * inv_n + eps)
    tl.store(rstd_ptr + row, rstd)
    n = v * rstd
    if PER_OP:
        y = w * n.to(lp).to(tl.float32)
    else:
        y = n * w
    tl.store(y_ptr + row * sy + cols, y.to(lp), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,
    M, N, inv_n, rows_per_program, sdy, sdres, sa, sb, sdx,
    HAS_DRES: tl.constexpr, HAS_B: tl.constexpr, ROUND_W: tl.constexpr, NEED_DW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    lp: tl.constexpr = a_ptr.dtype.element_ty
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ROUND_W:
        w = w.to(lp).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.range(0, rows_per_program):
        row = pid.to(tl.int64) * rows_per_program + i
        m = mask & (row < M)
        dy = tl.load(dy_ptr + row * sdy + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        v = tl.load(a_ptr + row * sa + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if HAS_B:
            v = v + tl.load(b_ptr + row * sb + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        n = v * rstd
        dyw = dy * w
        c = tl.sum(dyw * n, axis=0) * inv_n
        dv = rstd * (dyw - n * c)
        if HAS_DRES:
            dv = dv + tl.load(dres_ptr + row * sdres + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_ptr + row * sdx + cols, dv.to(dx_ptr.dtype.element_ty), mask=m)
        if NEED_DW:
            dw += dy * n
    if NEED_DW:
        tl.store(dw_ptr + pid * N + cols, dw, mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_cols(n: int) -> int:
    if n > MAX_COLS:
        raise ValueError(f"fused RMSNorm handles rows of at most {MAX_COLS} elements, got {n}")
    return triton.next_power_of_2(max(n, 1))


def forward(x, residual, weight, eps: float, per_op: bool, fp32_sum: bool):
    """-> (y, new_residual or None, rstd [M] fp32). ``residual`` None means plain RMSNorm."""
    N = x.shape[-1]
    block = _check_cols(N)
    x2 = _rows(x)
    M = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    has_res = residual is not None
    if has_res:
        r2 = _rows(residual)
        new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        r2, new_res = x2, y
    if M:
        y2, res2 = y.view(-1, N), new_res.view(-1, N)
        _norm_fwd_kernel[(M,)](
            x2, r2, weight, y2, res2, rstd, N, 1.0 / N, eps,
            x2.stride(0), r2.stride(0), y2.stride(0), res2.stride(0),
            HAS_RES=has_res, FP32_SUM=fp32_sum, PER_OP=per_op,
            ROUND_W=weight.dtype == torch.float32 and x.dtype != torch.float32,
            BLOCK=block, num_warps=_fwd_warps(block), **LAUNCH_OPTS,
        )
    return y, (new_res if has_res else None), rstd


def backward(dy, dres, a, b, weight, rstd, need_dw: bool):
    """d_v (in a's dtype) and d_weight (weight's dtype, or None) for v = a (+ b)."""
    N = a.shape[-1]
    block = _check_cols(N)
    dy2, a2 = _rows(dy), _rows(a)
    b2 = _rows(b) if b is not None else a2
    dres2 = _rows(dres) if dres is not None else dy2
    M = a2.shape[0]
    dx = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    dx2 = dx.view(-1, N)
    programs = max(1, min(M, sm_count(a.device) * BWD_PROGRAMS_PER_SM))
    rows_per_program = triton.cdiv(M, programs) if M else 0
    dw_partial = torch.empty((programs, N), dtype=torch.float32, device=a.device) if need_dw else dx2
    if M:
        _norm_bwd_kernel[(programs,)](
            dy2, dres2, a2, b2, weight, rstd, dx2, dw_partial,
            M, N, 1.0 / N, rows_per_program,
            dy2.stride(0), dres2.stride(0), a2.stride(0), b2.stride(0), dx2.stride(0),
            HAS_DRES=dres is not None, HAS_B=b is not None,
            ROUND_W=weight.dtype == torch.float32 and a.dtype != torch.float32,
            NEED_DW=need_dw, BLOCK=block, num_warps=_bwd_warps(block),
            **LAUNCH_OPTS,
        )
    dw = None
    if need_dw:
        dw = (dw_partial.sum(0) if M else torch.zeros(N, device=a.device)).to(weight.dtype)
    return dx, dw
