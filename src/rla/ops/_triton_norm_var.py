"""RMSNorm whose mean square is another tensor's, in Triton: ``x * rsqrt(mean(s^2) + eps) * w``.

The kernels of ``rla.ops.rms_norm(..., variance_of=s)`` on CUDA (``rla.ops.variance_norm`` states
the op, its backward and its PyTorch reference). They are the norm kernels with the reduction
reading ``s`` (fp32) and the normalisation reading ``x``, written with those kernels' own helpers
and launch shapes, so every sum adds in their order by construction, not by a copy:

- forward, ``norm_reduction='unpinned'``: ``_triton_norm``'s tile (``FWD_ROWS`` rows of one
  power-of-two block, its warps) and its ``row_rstd`` over s: Triton's tree, the plain norm
  kernel's order, not PyTorch's (so, as the plain kernel, an fp32 ulp of rstd from the reference
  in a few rows);
- forward, ``vllm_block``: ``_triton_norm_tree``'s ``tree_sum_squares`` and ``tree_rstd`` over s,
  in the tree of the call (``reduction.call_tree``: the plain norm's, or under ``after_add`` the
  add + norm kernel's), every add explicit: the reference's order, bit for bit;
- the output: ``scale_rows`` of x with that rstd (``norm_weight`` per_op or fused, the engine's
  copy of the weight), stored in ``out_dtype``; one fp32 rstd per row is kept for backward.

With ``s = x`` (x fp32, or ``s = x.float()``) the forward is the plain norm kernel's, bit for bit.

Backward (``variance_norm``'s rule, every rounding straight-through): a persistent grid of the
plain norm backward's shape (``_triton_norm.backward_grid``: its tile, its rows per program); per
row, with n = x*rstd and dyw = dy*w, d_x = rstd*dyw, d_s = -rstd*(s*rstd)*mean(dyw*n) (the mean
is ``row_centre``, the plain backward's centring sum) and each program's d_weight partial sums
dy*n over its rows as the plain backward does, then the partials are summed over programs in fp32.
d_x is elementwise (the reference's bits wherever rstd is); the mean and d_weight add in Triton's
order, not PyTorch's. Gradients nobody needs are neither computed nor stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops import _triton_norm, _triton_norm_tree
from rla.ops._triton_common import LAUNCH_OPTS, cdiv, lp_kind, next_pow2, to_lp
from rla.ops._triton_norm import row_centre, row_rstd, scale_rows
from rla.ops._triton_norm_tree import tree_rstd, tree_sum_squares
from rla.ops.reduction import WARP, call_tree


@triton.jit
def _var_fwd_kernel(
    x_ptr, s_ptr, w_ptr, y_ptr, rstd_ptr,
    M, N, inv_n, eps, sx, ss,
    TREE: tl.constexpr, PER_OP: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr, ROWS: tl.constexpr,
    BLOCK: tl.constexpr, EV: tl.constexpr,
    THREADS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, ROUNDS: tl.constexpr, PAIRWISE: tl.constexpr,
):
    """``TREE``: rstd in vLLM's order (``THREADS`` ... ``PAIRWISE``: the call's tree), else in
    Triton's over the tile; then the normalised x."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rm = rows < M
    cm = cols < N
    mask = rm[:, None] & cm[None, :]
    r2, c2 = rows[:, None], cols[None, :]
    if TREE:
        total = tree_sum_squares(s_ptr, s_ptr, r2 * ss, r2 * ss, rm, N, False, False, LP,
                                 THREADS, LANES, VEC, ROUNDS, PAIRWISE, ROWS)
        rstd = tree_rstd(total, N, eps)
    else:
        s = tl.load(s_ptr + r2 * ss + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        rstd = row_rstd(s, inv_n, eps)
    tl.store(rstd_ptr + rows, rstd, mask=rm)
    v = tl.load(x_ptr + r2 * sx + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
    y = scale_rows(v, rstd, w[None, :], PER_OP, LP)
    tl.store(y_ptr + r2 * N + c2, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _var_bwd_kernel(
    dy_ptr, x_ptr, s_ptr, w_ptr, rstd_ptr, dx_ptr, ds_ptr, dw_ptr,
    M, N, inv_n, rows_per_program, sdy, sx, ss,
    NEED_DX: tl.constexpr, NEED_DS: tl.constexpr, NEED_DW: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STAGES: tl.constexpr,
):
    """One program's slice of rows: d_x, d_s (new, contiguous) and its d_weight partial."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cm = cols < N
    c2 = cols[None, :]
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
    w = w[None, :]
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    first = pid.to(tl.int64) * rows_per_program
    for i in tl.range(0, rows_per_program, ROWS, num_stages=STAGES):
        rows = first + i + tl.arange(0, ROWS)
        rm = rows < M
        mask = rm[:, None] & cm[None, :]
        r2 = rows[:, None]
        dy = tl.load(dy_ptr + r2 * sdy + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        v = tl.load(x_ptr + r2 * sx + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rm, other=0.0)[:, None]
        n = v * rstd
        dyw = dy * w
        if NEED_DX:
            tl.store(dx_ptr + r2 * N + c2, (rstd * dyw).to(dx_ptr.dtype.element_ty), mask=mask)
        if NEED_DS:
            c = row_centre(dyw, n, inv_n)
            s = tl.load(s_ptr + r2 * ss + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
            ds = -rstd * (s * rstd) * c[:, None]
            tl.store(ds_ptr + r2 * N + c2, ds.to(ds_ptr.dtype.element_ty), mask=mask)
        if NEED_DW:
            dw += tl.sum(dy * n, axis=0)
    if NEED_DW:
        tl.store(dw_ptr + pid * N + cols, dw, mask=cm)


def _round_w(weight, lp) -> bool:
    return weight.dtype == torch.float32 and lp != torch.float32


def forward(x, s, weight, eps: float, per_op: bool, tree: bool, after_add: bool, lp=None, out_dtype=None):
    """-> (y [x's shape, ``out_dtype``, default ``lp``], rstd [M] fp32). ``lp``: the stack dtype
    (default x's); ``tree``: ``norm_reduction='vllm_block'``, whose tree ``after_add`` picks."""
    lp = lp or x.dtype
    N = x.shape[-1]
    block = _triton_norm._check_cols(N)
    x2, s2 = _triton_norm._rows(x), _triton_norm._rows(s)
    M = x2.shape[0]
    y = torch.empty(x.shape, dtype=out_dtype or lp, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if not M:
        return y, rstd
    if tree:  # the tree kernel's launch shape; the order is in its explicit adds
        t = call_tree(s, fused_add=after_add)
        rows, warps = _triton_norm_tree.ROWS, _triton_norm_tree.NUM_WARPS
        shape = dict(THREADS=t.threads, LANES=max(WARP, next_pow2(t.threads)), VEC=t.vec, ROUNDS=t.rounds(N),
                     PAIRWISE=t.pairwise)
    else:  # the plain kernel's tile: its tl.sum's register layout, so its order
        rows = min(_triton_norm.FWD_ROWS, next_pow2(M))
        warps = _triton_norm._fwd_warps(block * rows)
        shape = dict(THREADS=1, LANES=WARP, VEC=1, ROUNDS=1, PAIRWISE=False)
    _var_fwd_kernel[(cdiv(M, rows),)](
        x2, s2, weight, y, rstd, M, N, 1.0 / N, eps, x2.stride(0), s2.stride(0),
        TREE=tree, PER_OP=per_op, ROUND_W=_round_w(weight, lp), LP=lp_kind(lp), ROWS=rows, BLOCK=block,
        EV=_triton_norm.EVICT, num_warps=warps, **shape, **LAUNCH_OPTS,
    )
    return y, rstd


def backward(dy, x, s, weight, rstd, need_dx: bool, need_ds: bool, need_dw: bool, lp=None):
    """(d_x in x's dtype, d_s in s's, d_weight in the weight's), each None where not needed."""
    lp = lp or x.dtype
    N = x.shape[-1]
    block = _triton_norm._check_cols(N)
    dy2, x2, s2 = _triton_norm._rows(dy), _triton_norm._rows(x), _triton_norm._rows(s)
    M = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_dx else None
    ds = torch.empty(s.shape, dtype=s.dtype, device=s.device) if need_ds else None
    rows, programs, rows_per_program, warps, _ = _triton_norm.backward_grid(M, N, x.device)
    partial = torch.empty((programs, N), dtype=torch.float32, device=x.device) if need_dw else None
    if M and (need_dx or need_ds or need_dw):
        spare = rstd  # what a pointer nobody writes is handed
        _var_bwd_kernel[(programs,)](
            dy2, x2, s2, weight, rstd, spare if dx is None else dx, spare if ds is None else ds,
            spare if partial is None else partial,
            M, N, 1.0 / N, rows_per_program, dy2.stride(0), x2.stride(0), s2.stride(0),
            NEED_DX=need_dx, NEED_DS=need_ds, NEED_DW=need_dw, ROUND_W=_round_w(weight, lp), LP=lp_kind(lp),
            ROWS=rows, BLOCK=block, EV=_triton_norm.EVICT, STAGES=_triton_norm.BWD_STAGES, num_warps=warps,
            **LAUNCH_OPTS,
        )
    dw = None
    if need_dw:
        dw = (partial.sum(0) if M else torch.zeros(N, device=x.device)).to(weight.dtype)
    return dx, ds, dw
