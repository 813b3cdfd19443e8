"""Qwen3's q/k RMSNorm and RoPE in one Triton kernel, forward and backward (``qk_norm_out='fp32'``).

The chain it replaces is three launches: the q norm and the k norm (``_triton_norm`` or
``_triton_norm_tree``) write fp32 q/k, which the RoPE kernel (``_triton_rope``) reads and rounds once.
Here each program normalises a tile of (token, head) rows and rotates them in registers: the fp32
norm output never reaches memory. One launch covers q and k (programs ``[0, PA)`` take q, the
rest k), forward and backward.

Bit for bit the chain's numbers, by construction rather than by luck:

- The rows are visited as the norm kernels visit them: row ``r`` is (b, s, h) of the
  [B, S, H, D] view HF's norm reads (token-major), ``ROWS`` rows per program, the same tile
  [ROWS, BLOCK], the same warps; the row math is the norm kernels' own ``@triton.jit`` helpers
  (``row_rstd``, ``scale_rows``, ``row_grad``, ``tree_sum_squares``), inlined here as there.
  Under ``norm_reduction='unpinned'`` rstd is Triton's tree reduction of that tile, so the tile
  and warps are what keeps it the norm kernel's sum; under ``vllm_block`` every add is explicit.
- The rotation needs, at column d, the partner column d +- D/2 of the same row: it is loaded
  (from L1, the row was just read) and normalised with the same rstd and weight, so both halves
  are exactly the values the chain's norm wrote in fp32. Then out = y*c -+ y_partner*s, the
  RoPE kernel's products and one add, rounded once at the store (``rope_rows``).
- Backward: a persistent grid with ``_triton_norm.backward_grid``'s partition of the rows and
  its tile (rows, warps), so each d_weight partial sums the same rows in the same order as the
  norm backward (one ``tl.sum`` over a tile's rows per tile, in row order), summed over programs
  by the same ``sum(0)``. Per row: dy = RoPE's backward (g*c +- g_partner*s_partner, fp32, never
  stored), then the norm's ``row_grad``. Narrow rows take two tiles per loop step
  (``_bwd_kernel``'s ``UNROLL=2``, the grid's unroll 2): both tiles' loads are issued before either's math,
  which changes when bytes are in flight, not what is added to what.

Saved for backward: q, k (the inputs; the chain's norms save them too) and rstd, one fp32 per
row. Outputs and input gradients are token-major ([B, S, H, D] memory, returned as the caller's
view), the layout the chain's norm allocates, so nothing downstream sees other strides.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rla.ops import _triton_norm, _triton_norm_tree
from rla.ops._layout import token_major
from rla.ops._triton_common import LAUNCH_OPTS, cdiv, lp_kind, next_pow2, to_lp
from rla.ops._triton_norm import backward_grid, row_grad, row_rstd, scale_rows
from rla.ops._triton_norm_tree import tree_rstd, tree_sum_squares
from rla.ops._triton_rope import _table_strides
from rla.ops.reduction import WARP, call_tree


@triton.jit
def _row_offsets(rows, S, H, sb, ss, sh):
    """(offset, b, s) of token-major rows r = (b*S + s)*H + h through strides (sb, ss, sh)."""
    h = rows % H
    t = rows // H
    b = t // S
    s = t % S
    return b * sb + s * ss + h * sh, b, s


@triton.jit
def _columns(cols, HALF, HALF_TABLE: tl.constexpr, PV: tl.constexpr):
    """(partner column d +- D/2, the table column of d, the table column of the partner).

    The shifted columns run contiguously in aligned groups of ``PV`` (a power of two dividing
    D/2), which the hints tell the compiler, so their loads can take the same register layout as
    the row's own load (a layout of their own could draw the row's reduction into another order;
    tests/ops/test_qk_norm_rope_triton.py compares the compiled layouts)."""
    lo = cols < HALF
    partner = tl.max_contiguous(tl.multiple_of(tl.where(lo, cols + HALF, cols - HALF), PV), PV)
    if HALF_TABLE:  # [.., D/2]: the first half, which the rotate-half table repeats
        t = tl.max_contiguous(tl.multiple_of(tl.where(lo, cols, cols - HALF), PV), PV)
        tp = t
    else:
        t = cols
        tp = partner
    return lo, partner, t, tp


@triton.jit
def rope_rows(y, yp, c, s, lo, PER_OP: tl.constexpr, LP: tl.constexpr):
    """RoPE at column d of rows: y at d, yp at the partner, c and s at d. First half
    y*c - yp*s, second half y*c + yp*s (``_triton_rope``'s o1 / o2, per_op rounding each product)."""
    a = y * c
    b = yp * s
    if PER_OP:
        a = to_lp(a, LP)
        b = to_lp(b, LP)
    return tl.where(lo, a - b, a + b)


@triton.jit
def rope_rows_grad(g, gp, c, sp, lo):
    """RoPE's backward at column d: g*c + gp*sp (first half), g*c - gp*sp (second half), sp
    the table's sin at the partner column (``_triton_rope``'s dx1 / dx2)."""
    a = g * c
    b = gp * sp
    return tl.where(lo, a + b, a - b)


@triton.jit
def _table(ptr, off, mask, ROUND_CS: tl.constexpr, LP: tl.constexpr):
    v = tl.load(ptr + off, mask=mask, other=0.0).to(tl.float32)
    if ROUND_CS:
        v = to_lp(v, LP)
    return v


@triton.jit
def _fwd_rows(
    x_ptr, w_ptr, o_ptr, rstd_ptr, cos_ptr, sin_ptr, p, M, S, H, sb, ss, sh, scb, scs, N, HALF, inv_n, eps,
    TREE: tl.constexpr, PER_OP_NORM: tl.constexpr, PER_OP_ROPE: tl.constexpr, ROUND_W: tl.constexpr,
    ROUND_CS: tl.constexpr, HALF_TABLE: tl.constexpr, LP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    EV: tl.constexpr, THREADS: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, ROUNDS: tl.constexpr,
    PAIRWISE: tl.constexpr, PV: tl.constexpr,
):
    rows = p.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rm = rows < M
    cm = cols < N
    mask = rm[:, None] & cm[None, :]
    xoff, b, s = _row_offsets(rows, S, H, sb, ss, sh)
    x2 = xoff[:, None]
    c2 = cols[None, :]
    v = tl.load(x_ptr + x2 + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    if TREE:
        total = tree_sum_squares(x_ptr, x_ptr, x2, x2, rm, N, False, False, LP,
                                 THREADS, LANES, VEC, ROUNDS, PAIRWISE, ROWS)
        rstd = tree_rstd(total, N, eps)
    else:
        rstd = row_rstd(v, inv_n, eps)
    tl.store(rstd_ptr + rows, rstd, mask=rm)
    lo, partner, tcol, _ = _columns(cols, HALF, HALF_TABLE, PV)
    vp = tl.load(x_ptr + x2 + partner[None, :], mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
        wp = to_lp(wp, LP)
    y = scale_rows(v, rstd, w[None, :], PER_OP_NORM, LP)  # the chain's fp32 norm output, at d
    yp = scale_rows(vp, rstd, wp[None, :], PER_OP_NORM, LP)  # and at the partner column
    toff = (b * scb + s * scs)[:, None] + tcol[None, :]
    c = _table(cos_ptr, toff, mask, ROUND_CS, LP)
    sn = _table(sin_ptr, toff, mask, ROUND_CS, LP)
    out = rope_rows(y, yp, c, sn, lo[None, :], PER_OP_ROPE, LP)
    tl.store(o_ptr + rows[:, None] * N + c2, out.to(o_ptr.dtype.element_ty), mask=mask)  # token-major


@triton.jit
def _fwd_kernel(
    qa_ptr, wa_ptr, oa_ptr, ra_ptr, qb_ptr, wb_ptr, ob_ptr, rb_ptr, cos_ptr, sin_ptr,
    PA, MA, MB, HA, HB, sab, sas, sah, sbb, sbs, sbh, S, scb, scs, N, HALF, inv_n, eps_a, eps_b,
    TREE: tl.constexpr, PER_OP_NORM: tl.constexpr, PER_OP_ROPE: tl.constexpr, ROUND_WA: tl.constexpr,
    ROUND_WB: tl.constexpr, ROUND_CS: tl.constexpr, HALF_TABLE: tl.constexpr, LP: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, THREADS: tl.constexpr, LANES: tl.constexpr,
    VEC: tl.constexpr, ROUNDS: tl.constexpr, PAIRWISE: tl.constexpr, PV: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < PA:
        _fwd_rows(qa_ptr, wa_ptr, oa_ptr, ra_ptr, cos_ptr, sin_ptr, pid, MA, S, HA, sab, sas, sah, scb, scs,
                  N, HALF, inv_n, eps_a, TREE, PER_OP_NORM, PER_OP_ROPE, ROUND_WA, ROUND_CS, HALF_TABLE, LP,
                  ROWS, BLOCK, EV, THREADS, LANES, VEC, ROUNDS, PAIRWISE, PV)
    else:
        _fwd_rows(qb_ptr, wb_ptr, ob_ptr, rb_ptr, cos_ptr, sin_ptr, pid - PA, MB, S, HB, sbb, sbs, sbh, scb, scs,
                  N, HALF, inv_n, eps_b, TREE, PER_OP_NORM, PER_OP_ROPE, ROUND_WB, ROUND_CS, HALF_TABLE, LP,
                  ROWS, BLOCK, EV, THREADS, LANES, VEC, ROUNDS, PAIRWISE, PV)


@triton.jit
def _bwd_load(g_ptr, x_ptr, rstd_ptr, cos_ptr, sin_ptr, rows, M, S, H, sgb, sgs, sgh, sxb, sxs, sxh, scb, scs,
              cm, c2, p2, tcol, tpcol, lo, ROUND_CS: tl.constexpr, LP: tl.constexpr, EV: tl.constexpr):
    """(dy, v, rstd, mask) of one [ROWS, BLOCK] tile: dy = RoPE's backward of g (fp32, in registers)."""
    rm = rows < M
    mask = rm[:, None] & cm[None, :]
    goff, b, s = _row_offsets(rows, S, H, sgb, sgs, sgh)
    xoff, _, _ = _row_offsets(rows, S, H, sxb, sxs, sxh)
    toff = (b * scb + s * scs)[:, None]
    g = tl.load(g_ptr + goff[:, None] + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    gp = tl.load(g_ptr + goff[:, None] + p2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    c = _table(cos_ptr, toff + tcol[None, :], mask, ROUND_CS, LP)
    sp = _table(sin_ptr, toff + tpcol[None, :], mask, ROUND_CS, LP)
    dy = rope_rows_grad(g, gp, c, sp, lo[None, :])  # the chain's fp32 RoPE gradient, in registers
    v = tl.load(x_ptr + xoff[:, None] + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rm, other=0.0)[:, None]
    return dy, v, rstd, mask


@triton.jit
def _bwd_store(dy, v, rstd, mask, rows, w, dx_ptr, dw, N, inv_n, c2, NEED_DW: tl.constexpr):
    """The norm's ``row_grad`` of one tile, d_x stored; returns d_weight's partial plus the
    tile's column sums of dy*n (``tl.sum`` over its ROWS rows, the norm backward's step)."""
    dv, n = row_grad(dy, v, rstd, w, inv_n)
    tl.store(dx_ptr + rows[:, None] * N + c2, dv.to(dx_ptr.dtype.element_ty), mask=mask)  # token-major
    if NEED_DW:
        dw += tl.sum(dy * n, axis=0)
    return dw


@triton.jit
def _bwd_rows(
    g_ptr, x_ptr, w_ptr, rstd_ptr, cos_ptr, sin_ptr, dx_ptr, dw_ptr, p, M, rows_per_program, S, H,
    sgb, sgs, sgh, sxb, sxs, sxh, scb, scs, N, HALF, inv_n,
    ROUND_W: tl.constexpr, ROUND_CS: tl.constexpr, HALF_TABLE: tl.constexpr, LP: tl.constexpr,
    NEED_DW: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STAGES: tl.constexpr,
    PV: tl.constexpr, UNROLL: tl.constexpr,
):
    """One program's slice of rows, ``ROWS * UNROLL`` per loop step: the loads of the step's
    ``UNROLL`` tiles (1 or 2) are issued before either tile's math, so more bytes are in flight
    per thread; each tile is then the norm backward's loop step (its [ROWS, BLOCK] tile, its
    ``row_grad``, its ``tl.sum`` into d_weight), in row order, so d_weight's partial adds the
    norm backward's column sums of the same rows in the same order."""
    cols = tl.arange(0, BLOCK)
    cm = cols < N
    c2 = cols[None, :]
    lo, partner, tcol, tpcol = _columns(cols, HALF, HALF_TABLE, PV)
    p2 = partner[None, :]
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
    w = w[None, :]
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    first = p.to(tl.int64) * rows_per_program
    for i in tl.range(0, rows_per_program, ROWS * UNROLL, num_stages=STAGES):
        rows = first + i + tl.arange(0, ROWS)
        dy, v, rstd, mask = _bwd_load(g_ptr, x_ptr, rstd_ptr, cos_ptr, sin_ptr, rows, M, S, H, sgb, sgs, sgh,
                                      sxb, sxs, sxh, scb, scs, cm, c2, p2, tcol, tpcol, lo, ROUND_CS, LP, EV)
        if UNROLL == 2:
            dy1, v1, rstd1, mask1 = _bwd_load(g_ptr, x_ptr, rstd_ptr, cos_ptr, sin_ptr, rows + ROWS, M, S, H,
                                              sgb, sgs, sgh, sxb, sxs, sxh, scb, scs, cm, c2, p2, tcol, tpcol, lo,
                                              ROUND_CS, LP, EV)
        dw = _bwd_store(dy, v, rstd, mask, rows, w, dx_ptr, dw, N, inv_n, c2, NEED_DW)
        if UNROLL == 2:
            dw = _bwd_store(dy1, v1, rstd1, mask1, rows + ROWS, w, dx_ptr, dw, N, inv_n, c2, NEED_DW)
    if NEED_DW:
        tl.store(dw_ptr + p * N + cols, dw, mask=cm)


@triton.jit
def _bwd_kernel(
    ga_ptr, xa_ptr, wa_ptr, ra_ptr, dxa_ptr, dwa_ptr, gb_ptr, xb_ptr, wb_ptr, rb_ptr, dxb_ptr, dwb_ptr,
    cos_ptr, sin_ptr, PA, MA, MB, RPA, RPB, HA, HB, gab, gas, gah, xab, xas, xah, gbb, gbs, gbh, xbb, xbs, xbh,
    S, scb, scs, N, HALF, inv_n,
    ROUND_WA: tl.constexpr, ROUND_WB: tl.constexpr, ROUND_CS: tl.constexpr, HALF_TABLE: tl.constexpr,
    LP: tl.constexpr, NEED_DWA: tl.constexpr, NEED_DWB: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    EV: tl.constexpr, STAGES: tl.constexpr, PV: tl.constexpr, UNROLL: tl.constexpr,
):
    """Programs [0, PA) take the first call's rows (q), the rest the second's (k); ``UNROLL``
    tiles per loop step (``backward_tile``'s unroll: 1 for wide rows, 2 for narrow ones, whose
    two tiles' loads are issued together)."""
    pid = tl.program_id(0)
    if pid < PA:
        _bwd_rows(ga_ptr, xa_ptr, wa_ptr, ra_ptr, cos_ptr, sin_ptr, dxa_ptr, dwa_ptr, pid, MA, RPA, S, HA,
                  gab, gas, gah, xab, xas, xah, scb, scs, N, HALF, inv_n,
                  ROUND_WA, ROUND_CS, HALF_TABLE, LP, NEED_DWA, ROWS, BLOCK, EV, STAGES, PV, UNROLL)
    else:
        _bwd_rows(gb_ptr, xb_ptr, wb_ptr, rb_ptr, cos_ptr, sin_ptr, dxb_ptr, dwb_ptr, pid - PA, MB, RPB, S, HB,
                  gbb, gbs, gbh, xbb, xbs, xbh, scb, scs, N, HALF, inv_n,
                  ROUND_WB, ROUND_CS, HALF_TABLE, LP, NEED_DWB, ROWS, BLOCK, EV, STAGES, PV, UNROLL)


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


def _dims(x: torch.Tensor, head_axis: int) -> tuple[int, int, int, int]:
    """(B, S, H, D) of a [B, H, S, D] (head_axis 1) or [B, S, H, D] (2) tensor."""
    return x.shape[0], x.shape[3 - head_axis], x.shape[head_axis], x.shape[3]


def _strides(x: torch.Tensor, head_axis: int) -> tuple[int, int, int]:
    """(batch, position, head) strides of ``x``."""
    st = x.stride()
    return st[0], st[3 - head_axis], st[head_axis]


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _tables(cos, sin):
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def _pv(n: int) -> int:
    """The contiguity hint of the shifted columns: the largest power of two up to 16 dividing D/2."""
    return math.gcd(n // 2, 16) if n >= 2 else 1


def _round_w(w: torch.Tensor, lp) -> bool:
    return w.dtype == torch.float32 and lp != torch.float32


def _fwd_config(M: int, N: int, reduction: str, x: torch.Tensor) -> dict:
    """The tile, warps and reduction constants the norm forward of these M rows uses."""
    block = _triton_norm._check_cols(N)
    if reduction == "vllm_block":
        tree = call_tree(x, fused_add=False)  # the plain norm's tree for this call's rows
        return dict(TREE=True, ROWS=_triton_norm_tree.ROWS, BLOCK=block, num_warps=_triton_norm_tree.NUM_WARPS,
                    THREADS=tree.threads, LANES=max(WARP, next_pow2(tree.threads)), VEC=tree.vec,
                    ROUNDS=tree.rounds(N), PAIRWISE=tree.pairwise)
    rows = min(_triton_norm.FWD_ROWS, next_pow2(M))
    return dict(TREE=False, ROWS=rows, BLOCK=block, num_warps=_triton_norm._fwd_warps(block * rows),
                THREADS=1, LANES=WARP, VEC=1, ROUNDS=1, PAIRWISE=False)


def forward(q, k, wq, wk, eps_q: float, eps_k: float, cos, sin, round_cos_sin: bool, per_op_rope: bool,
            per_op_norm: bool, reduction: str, head_axis: int):
    """-> (q_out, k_out, rstd_q [Mq], rstd_k [Mk]); outputs token-major in q's dtype (the stack's)."""
    lp = q.dtype
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = _tables(cos, sin)
    B, S, HQ, N = _dims(q, head_axis)
    HK = k.shape[head_axis]
    oq, ok = token_major(q, head_axis), token_major(k, head_axis)
    MQ, MK = B * S * HQ, B * S * HK
    rq = torch.empty(MQ, dtype=torch.float32, device=q.device)
    rk = torch.empty(MK, dtype=torch.float32, device=q.device)
    if MQ + MK == 0 or N == 0:
        return oq, ok, rq, rk
    scb, scs = _table_strides(cos, B, S)
    common = dict(PER_OP_NORM=per_op_norm, PER_OP_ROPE=per_op_rope, ROUND_CS=round_cos_sin,
                  HALF_TABLE=cos.shape[-1] != N, LP=lp_kind(lp), EV=_triton_norm.EVICT, PV=_pv(N))
    # The rows of q and k are normalised as two separate norm calls: one launch when both calls
    # take the same tile (always for head dims up to 2048 with more than one row each), else two.
    parts = [(q, wq, oq, rq, MQ, HQ, eps_q), (k, wk, ok, rk, MK, HK, eps_k)]
    configs = [_fwd_config(m, N, reduction, x) for x, _, _, _, m, _, _ in parts]
    groups = [parts] if configs[0] == configs[1] else [[parts[0], parts[0][:4] + (0,) + parts[0][5:]],
                                                       [parts[1], parts[1][:4] + (0,) + parts[1][5:]]]
    for group, cfg in zip(groups, configs):
        (xa, wa, oa, ra, ma, ha, ea), (xb, wb, ob, rb, mb, hb, eb) = group
        pa, pb = cdiv(ma, cfg["ROWS"]), cdiv(mb, cfg["ROWS"])
        if pa + pb == 0:
            continue
        cfg = dict(cfg)
        num_warps = cfg.pop("num_warps")
        _fwd_kernel[(pa + pb,)](
            xa, wa, oa, ra, xb, wb, ob, rb, cos, sin,
            pa, ma, mb, ha, hb, *_strides(xa, head_axis), *_strides(xb, head_axis), S, scb, scs,
            N, N // 2, 1.0 / N, ea, eb,
            ROUND_WA=_round_w(wa, lp), ROUND_WB=_round_w(wb, lp), **common, **cfg,
            num_warps=num_warps, **LAUNCH_OPTS,
        )
    return oq, ok, rq, rk


def backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, round_cos_sin: bool, head_axis: int,
             need_dwq: bool, need_dwk: bool):
    """-> (dq, dk, dwq or None, dwk or None); dq/dk token-major in q's dtype."""
    lp = q.dtype
    q, k, gq, gk = _unit_last(q), _unit_last(k), _unit_last(gq), _unit_last(gk)
    cos, sin = _tables(cos, sin)
    B, S, HQ, N = _dims(q, head_axis)
    HK = k.shape[head_axis]
    block = _triton_norm._check_cols(N)
    dq, dk = token_major(q, head_axis), token_major(k, head_axis)
    MQ, MK = B * S * HQ, B * S * HK
    gridq, gridk = backward_grid(MQ, N, q.device), backward_grid(MK, N, q.device)
    dwq_p = torch.empty((gridq[1], N), dtype=torch.float32, device=q.device) if need_dwq else rq
    dwk_p = torch.empty((gridk[1], N), dtype=torch.float32, device=q.device) if need_dwk else rk
    scb, scs = _table_strides(cos, B, S) if MQ + MK else (0, 0)
    common = dict(ROUND_CS=round_cos_sin, HALF_TABLE=cos.shape[-1] != N, LP=lp_kind(lp), BLOCK=block,
                  EV=_triton_norm.EVICT, STAGES=_triton_norm.BWD_STAGES, PV=_pv(N))
    parts = [(gq, q, wq, rq, dq, dwq_p, MQ, gridq, HQ, need_dwq), (gk, k, wk, rk, dk, dwk_p, MK, gridk, HK, need_dwk)]
    # one launch when q's and k's calls take the same tile (rows, warps, unroll), else two
    same = gridq[:1] + gridq[3:] == gridk[:1] + gridk[3:]
    groups = [parts] if same else [[parts[0], parts[0][:6] + (0, gridq[:1] + (0, 1) + gridq[3:]) + parts[0][8:]],
                                   [parts[1], parts[1][:6] + (0, gridk[:1] + (0, 1) + gridk[3:]) + parts[1][8:]]]
    for (ga, xa, wa, ra, dxa, dwa, ma, (rows, pa, rpa, warps, unroll), ha, nda), \
            (gb, xb, wb, rb, dxb, dwb, mb, (_, pb, rpb, _, _), hb, ndb) in groups:
        pa, pb = (pa if ma else 0), (pb if mb else 0)
        if pa + pb == 0:
            continue
        _bwd_kernel[(pa + pb,)](
            ga, xa, wa, ra, dxa, dwa, gb, xb, wb, rb, dxb, dwb, cos, sin,
            pa, ma, mb, rpa, rpb, ha, hb, *_strides(ga, head_axis), *_strides(xa, head_axis),
            *_strides(gb, head_axis), *_strides(xb, head_axis), S, scb, scs, N, N // 2, 1.0 / N,
            ROUND_WA=_round_w(wa, lp), ROUND_WB=_round_w(wb, lp), NEED_DWA=nda, NEED_DWB=ndb, ROWS=rows,
            UNROLL=unroll, num_warps=warps, **common, **LAUNCH_OPTS,
        )
    dwq = dwk = None
    if need_dwq:
        dwq = (dwq_p.sum(0) if MQ else torch.zeros(N, device=q.device)).to(wq.dtype)
    if need_dwk:
        dwk = (dwk_p.sum(0) if MK else torch.zeros(N, device=q.device)).to(wk.dtype)
    return dq, dk, dwq, dwk
