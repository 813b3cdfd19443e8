"""RMSNorm and residual-add + RMSNorm forward in Triton, with the sum of squares added in vLLM's order.

The ``norm_reduction='vllm_block'`` forward (the order is specified in ``rla.ops.reduction``;
``reduction.block_sum_squares`` is its oracle). Each program takes ``ROWS`` rows. Per row it
rebuilds the engine's ``THREADS`` per-thread partials explicitly: round ``r`` reads vector
``r * THREADS + t`` for every thread ``t`` (one strided load per element of the vector, from L1/L2)
and adds the squares in the kernel's order; the partials are then reduced as cub's block reduction
does, a neighbour tree over the 32 lanes of each warp (reshape to pairs, one add per level) and
the warps' sums added one after the other. Zeros stand in for threads and reads past the row's
end, which add exactly. The rest (rstd with an IEEE division, the output, the residual handed on)
is ``_triton_norm``'s forward, and the backward is ``_triton_norm.backward`` on the saved rstd: the
gradient does not depend on the order the forward added in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, div_rn, lp_kind, next_pow2, rsqrt, to_lp
from rla.ops._triton_norm import scale_rows
from rla.ops.reduction import WARP, BlockTree

ROWS = 4  # rows per program: q/k norms have millions of rows of 128
NUM_WARPS = 4


@triton.jit
def _value(x_ptr, r_ptr, xoff, roff, cols, mask, HAS_RES: tl.constexpr, FP32_SUM: tl.constexpr, LP: tl.constexpr):
    """The fp32 value the norm reads at (row, cols), rows at offsets xoff / roff [R, 1]: x, or
    RN(x + r) / x + r."""
    v = tl.load(x_ptr + xoff + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        total = v + tl.load(r_ptr + roff + cols, mask=mask, other=0.0).to(tl.float32)
        if FP32_SUM:
            v = total
        else:
            v = to_lp(total, LP)
    return v


@triton.jit
def tree_sum_squares(
    x_ptr, r_ptr, xoff, roff, rm, N,
    HAS_RES: tl.constexpr, FP32_SUM: tl.constexpr, LP: tl.constexpr,
    THREADS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, ROUNDS: tl.constexpr,
    PAIRWISE: tl.constexpr, R: tl.constexpr,
):
    """sum(v*v) of R rows (at offsets xoff / roff [R, 1]; rm [R] which exist) in vLLM's order
    -> [R] fp32. Every add is explicit, so the result does not depend on the kernel it is inlined
    into (the fused q/k norm + RoPE kernel shares it)."""
    W: tl.constexpr = LANES // 32
    t = tl.arange(0, LANES)[None, :]
    nv = N // VEC
    partial = tl.zeros([R, LANES], dtype=tl.float32)
    for rnd in tl.static_range(ROUNDS):
        vi = rnd * THREADS + t
        m = rm[:, None] & (t < THREADS) & (vi < nv)
        if PAIRWISE:  # a vector's squares as pair sums, left to right, then into the partial
            s = tl.zeros([R, LANES], dtype=tl.float32)
            for j in tl.static_range(0, VEC, 2):
                a = _value(x_ptr, r_ptr, xoff, roff, vi * VEC + j, m, HAS_RES, FP32_SUM, LP)
                b = _value(x_ptr, r_ptr, xoff, roff, vi * VEC + j + 1, m, HAS_RES, FP32_SUM, LP)
                s = s + (a * a + b * b)
            partial = partial + s
        else:  # each square into the partial, one after the other
            for j in tl.static_range(VEC):
                a = _value(x_ptr, r_ptr, xoff, roff, vi * VEC + j, m, HAS_RES, FP32_SUM, LP)
                partial = partial + a * a
    # within a warp: neighbours first, five levels of one add each
    lanes = tl.reshape(partial, [R, W, 32])
    lanes = tl.sum(tl.reshape(lanes, [R, W, 16, 2]), axis=3)
    lanes = tl.sum(tl.reshape(lanes, [R, W, 8, 2]), axis=3)
    lanes = tl.sum(tl.reshape(lanes, [R, W, 4, 2]), axis=3)
    lanes = tl.sum(tl.reshape(lanes, [R, W, 2, 2]), axis=3)
    warps = tl.sum(lanes, axis=2)  # [R, W]
    # the warps' sums in warp order (adding the zeros of the other warps is exact)
    widx = tl.arange(0, W)[None, :]
    total = tl.sum(tl.where(widx == 0, warps, 0.0), axis=1)
    for w in tl.static_range(1, W):
        total = total + tl.sum(tl.where(widx == w, warps, 0.0), axis=1)
    return total


@triton.jit
def tree_rstd(total, N, eps):
    """rstd from the row sum: an IEEE division by n, + eps, rsqrt."""
    return rsqrt(div_rn(total, N.to(tl.float32)) + eps)


@triton.jit
def _tree_fwd_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, res_ptr, rstd_ptr,
    M, N, eps, sx, sr,
    HAS_RES: tl.constexpr, FP32_SUM: tl.constexpr, PER_OP: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr,
    THREADS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, ROUNDS: tl.constexpr,
    PAIRWISE: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr, STORE_RES: tl.constexpr,
):
    """``STORE_RES`` as in ``_triton_norm._norm_fwd_kernel``: RN(x + r) with a residual, RN(x)
    without one."""
    rows = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    rm = rows < M
    r2 = rows[:, None]
    total = tree_sum_squares(x_ptr, r_ptr, r2 * sx, r2 * sr, rm, N, HAS_RES, FP32_SUM, LP,
                             THREADS, LANES, VEC, ROUNDS, PAIRWISE, R)
    rstd = tree_rstd(total, N, eps)
    tl.store(rstd_ptr + rows, rstd, mask=rm)

    cols = tl.arange(0, BLOCK)[None, :]
    cm = cols < N
    mask = rm[:, None] & cm
    x = tl.load(x_ptr + r2 * sx + cols, mask=mask, other=0.0).to(tl.float32)
    v = x
    if HAS_RES:
        total_v = x + tl.load(r_ptr + r2 * sr + cols, mask=mask, other=0.0).to(tl.float32)
        new_res = to_lp(total_v, LP)
        if STORE_RES:
            tl.store(res_ptr + r2 * N + cols, new_res.to(res_ptr.dtype.element_ty), mask=mask)
        if FP32_SUM:
            v = total_v
        else:
            v = new_res
    elif STORE_RES:
        tl.store(res_ptr + r2 * N + cols, to_lp(x, LP).to(res_ptr.dtype.element_ty), mask=mask)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
    y = scale_rows(v, rstd, w, PER_OP, LP)
    tl.store(y_ptr + r2 * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, residual, weight, eps: float, per_op: bool, fp32_sum: bool, tree: BlockTree, lp=None, out_dtype=None,
            rounded=None):
    """-> (y, new_residual or None, rstd [M] fp32), the sum of squares added in ``tree``'s order.
    ``lp``: the stack dtype (x may be an fp32 residual sum); ``out_dtype``: y's dtype (default lp);
    ``rounded``: as for ``_triton_norm.forward``."""
    from rla.ops._triton_norm import forward_buffers, stores_rounded

    lp = lp or x.dtype
    N = x.shape[-1]
    if N % tree.vec:
        raise ValueError(f"rows of {N} elements cannot be read in vectors of {tree.vec}")
    x2, r2, y, new_res, rstd, block = forward_buffers(x, residual, lp, out_dtype, rounded)
    M, has_res, store = x2.shape[0], residual is not None, stores_rounded(residual, rounded)
    if M:
        lanes = max(WARP, next_pow2(tree.threads))
        _tree_fwd_kernel[(cdiv(M, ROWS),)](
            x2, r2, weight, y, new_res, rstd, M, N, eps, x2.stride(0), r2.stride(0),
            HAS_RES=has_res, FP32_SUM=fp32_sum, PER_OP=per_op,
            ROUND_W=weight.dtype == torch.float32 and lp != torch.float32, LP=lp_kind(lp),
            THREADS=tree.threads, LANES=lanes, VEC=tree.vec, ROUNDS=tree.rounds(N),
            PAIRWISE=tree.pairwise, R=ROWS, BLOCK=block, STORE_RES=store, num_warps=NUM_WARPS, **LAUNCH_OPTS,
        )
    return y, (new_res if store else None), rstd
