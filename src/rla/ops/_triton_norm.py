"""RMSNorm and residual-add + RMSNorm in Triton, forward and backward.

Forward: one program per row (the hidden size fits one block: up to 64K columns). It reads x (and
the residual r), writes the normalised row (and RN(x + r)) and one fp32 rstd per row for the
backward. Backward: a persistent grid of a few programs per multiprocessor; each walks a slice of
the rows, writes d_x (for add+norm, d_x = d_r, the same tensor is handed to both inputs) and keeps
its share of d_weight in registers, summed over programs afterwards in fp32. The backward has two
entries with one body: v = a (+ b) as read, and v = a + RN(b) for an fp32 b (add + norm of a
residual kept as the fp32 tensor it was rounded from, ``rla.ops.add_rms_norm(residual_source=)``).

Numerics (docs/rounding.md, ``norm.weight`` and ``norm.residual``):
  v    = x                      (rms_norm)
       = RN(x + r) or x + r      (add_rms_norm, rounded_sum or fp32_sum; the residual handed on
                                  is RN(x + r) in both)
  rstd = rsqrt(sum(v*v) * RN(1/N) + eps)   PyTorch's ``mean`` multiplies the sum by the fp32
                                  factor 1/N; the summation order is Triton's tree, not PyTorch's,
                                  so rstd may differ from the reference by an ulp (the issue allows
                                  one lp ulp on the output; two under per_op, see fused.py)
  w    = RN(weight) when the weight is fp32 and x is not (the engine's copy), else weight
  out  = RN(w * RN(v*rstd))     (per_op)  or  RN((v*rstd) * w)  (fused)
Backward, with n = v*rstd and every rounding straight-through:
  d_v = rstd * (dy*w - n * mean(dy*w*n)) [+ d_residual],  d_w = sum over rows of dy*n.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla.ops._triton_common import LAUNCH_OPTS, cdiv, lp_kind, next_pow2, rsqrt, sm_count, to_lp

MAX_COLS = 65536
#: Launch parameters, picked by lab/bench/tune_fused.py at 16384 x 3584 bf16; the times it
#: measured, against the copy-bandwidth floor, are in its results file (results/benchmarks/).
FWD_ROWS = 2  # rows per forward program
FWD_WARPS: int | None = 4  # None: one warp per 512 columns, 4 to 32
BWD_ROWS = 1  # rows per backward loop step
BWD_WARPS: int | None = 8
BWD_PROGRAMS_PER_SM = 4  # persistent backward grid; each keeps a d_weight row in registers
BWD_STAGES = 2  # software pipelining of the row loop (loads of row i+1 in flight during row i)
#: Rows of at most NARROW_COLS columns (their power-of-two block: q/k head dims 64-256) take the
#: narrow backward tile instead of BWD_ROWS/BWD_WARPS: BWD_NARROW_WARPS warps and as many rows as
#: give each thread one element (32 * warps / block). That is the register layout of a row in the
#: one-row tile of 8 warps (one element per thread, the row across 32 lanes and block/32 warps),
#: so each row's ``tl.sum`` adds in the same order and d_x is that tile's bit for bit; the
#: one-row tile left half its threads idle at block 128 (tests/ops/test_norm_bwd_tiles.py).
NARROW_COLS = 256
BWD_NARROW_WARPS = 8
BWD_UNROLL = 2  # narrow rows: loop steps whose loads the fused q/k backward issues together
EVICT = ""  # no eviction hint: evict_first was slower in the tuning run


def _fwd_warps(block: int) -> int:
    return FWD_WARPS or max(4, min(32, block // 512))


def _bwd_warps(block: int) -> int:
    return BWD_WARPS or max(4, min(16, block // 256))


# The row math, shared with the fused q/k norm + RoPE kernel (``_triton_qk_norm_rope``), which
# must produce these kernels' numbers bit for bit: one definition, inlined into both.


@triton.jit
def row_rstd(v, inv_n, eps):
    """rstd of fp32 rows ``v`` [ROWS, BLOCK] (zeros past the row's end), the sum in Triton's tree."""
    return rsqrt(tl.sum(v * v, axis=1) * inv_n + eps)


@triton.jit
def scale_rows(v, rstd, w, PER_OP: tl.constexpr, LP: tl.constexpr):
    """The normalised rows in fp32: ``v`` [ROWS, BLOCK], ``rstd`` [ROWS], ``w`` [1, BLOCK] (the
    engine's copy of the weight); RN(w * RN(v*rstd)) per_op, RN((v*rstd) * w) fused, unrounded."""
    n = v * rstd[:, None]
    if PER_OP:
        y = w * to_lp(n, LP)
    else:
        y = n * w
    return y


@triton.jit
def row_centre(dyw, n, inv_n):
    """mean(dy*w*n) of rows ``dyw``, ``n`` [ROWS, BLOCK] fp32 -> [ROWS]: the backward's one row sum
    (Triton's tree, then the fp32 factor 1/N as PyTorch's ``mean``), shared with the norm whose mean
    square is another tensor's (``_triton_norm_var``)."""
    return tl.sum(dyw * n, axis=1) * inv_n


@triton.jit
def row_grad(dy, v, rstd, w, inv_n):
    """(d_v, n) of rows: ``dy``, ``v`` [ROWS, BLOCK] fp32, ``rstd`` [ROWS, 1], ``w`` [1, BLOCK];
    d_v = rstd * (dy*w - n * mean(dy*w*n)) with n = v*rstd (every rounding straight-through)."""
    n = v * rstd
    dyw = dy * w
    c = row_centre(dyw, n, inv_n)
    dv = rstd * (dyw - n * c[:, None])
    return dv, n


@triton.jit
def _norm_fwd_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, res_ptr, rstd_ptr,
    M, N, inv_n, eps, sx, sr,
    HAS_RES: tl.constexpr, FP32_SUM: tl.constexpr, PER_OP: tl.constexpr, ROUND_W: tl.constexpr,
    LP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STORE_RES: tl.constexpr,
):
    """``STORE_RES``: write RN of the value before the norm to ``res_ptr``: RN(x + r) with a
    residual (the residual handed on; off when nothing reads it), RN(x) without one (the rounded
    copy of an fp32 residual sum, ``rms_norm_and_round``)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rm = rows < M
    cm = cols < N
    mask = rm[:, None] & cm[None, :]
    r2, c2 = rows[:, None], cols[None, :]
    v = tl.load(x_ptr + r2 * sx + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + r2 * sr + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        total = v + r
        new_res = to_lp(total, LP)
        if STORE_RES:
            tl.store(res_ptr + r2 * N + c2, new_res.to(res_ptr.dtype.element_ty), mask=mask)  # new, contiguous
        if FP32_SUM:
            v = total
        else:
            v = new_res
    elif STORE_RES:
        tl.store(res_ptr + r2 * N + c2, to_lp(v, LP).to(res_ptr.dtype.element_ty), mask=mask)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if ROUND_W:
        w = to_lp(w, LP)
    rstd = row_rstd(v, inv_n, eps)
    tl.store(rstd_ptr + rows, rstd, mask=rm)
    y = scale_rows(v, rstd, w[None, :], PER_OP, LP)
    tl.store(y_ptr + r2 * N + c2, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_rows(
    dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,
    M, N, inv_n, rows_per_program, sdy, sdres, sa, sb,
    HAS_DRES: tl.constexpr, HAS_B: tl.constexpr, ROUND_B: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr,
    NEED_DW: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STAGES: tl.constexpr,
):
    """The backward's body, inlined into both entries below: one program's slice of rows. With
    ``ROUND_B`` the second term b is read as RN(b) (an fp32 tensor rounded to ``LP`` as it loads)."""
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
        v = tl.load(a_ptr + r2 * sa + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        if HAS_B:
            b = tl.load(b_ptr + r2 * sb + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
            if ROUND_B:
                b = to_lp(b, LP)
            v = v + b
        rstd = tl.load(rstd_ptr + rows, mask=rm, other=0.0)[:, None]
        dv, n = row_grad(dy, v, rstd, w, inv_n)
        if HAS_DRES:
            dv = dv + tl.load(dres_ptr + r2 * sdres + c2, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
        tl.store(dx_ptr + r2 * N + c2, dv.to(dx_ptr.dtype.element_ty), mask=mask)  # new, contiguous
        if NEED_DW:
            dw += tl.sum(dy * n, axis=0)
    if NEED_DW:
        tl.store(dw_ptr + pid * N + cols, dw, mask=cm)


@triton.jit
def _norm_bwd_kernel(
    dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,
    M, N, inv_n, rows_per_program, sdy, sdres, sa, sb,
    HAS_DRES: tl.constexpr, HAS_B: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr, NEED_DW: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STAGES: tl.constexpr,
):
    """v = a (+ b), both read as they are (rms_norm; add_rms_norm's x and r or its rounded sum)."""
    _norm_bwd_rows(dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, M, N, inv_n, rows_per_program,
                   sdy, sdres, sa, sb, HAS_DRES, HAS_B, False, ROUND_W, LP, NEED_DW, ROWS, BLOCK, EV, STAGES)


@triton.jit
def _norm_bwd_rounded_b_kernel(
    dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,
    M, N, inv_n, rows_per_program, sdy, sdres, sa, sb,
    HAS_DRES: tl.constexpr, ROUND_W: tl.constexpr, LP: tl.constexpr, NEED_DW: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, EV: tl.constexpr, STAGES: tl.constexpr,
):
    """v = a + RN(b) with b fp32: add_rms_norm of a residual r given as the fp32 tensor it was
    rounded from (``rla.ops.add_rms_norm(residual_source=)``); RN(b) is r bit for bit."""
    _norm_bwd_rows(dy_ptr, dres_ptr, a_ptr, b_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, M, N, inv_n, rows_per_program,
                   sdy, sdres, sa, sb, HAS_DRES, True, True, ROUND_W, LP, NEED_DW, ROWS, BLOCK, EV, STAGES)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_cols(n: int) -> int:
    if n > MAX_COLS:
        raise ValueError(f"fused RMSNorm handles rows of at most {MAX_COLS} elements, got {n}")
    return next_pow2(max(n, 1))


def stores_rounded(residual, rounded) -> bool:
    """Whether a norm forward writes its rounded input: ``rounded`` None means the default, RN(x + r)
    with a residual and nothing without one."""
    return residual is not None if rounded is None else bool(rounded)


def forward_buffers(x, residual, lp, out_dtype=None, rounded=None):
    """A norm forward's row views and new outputs: (x2, r2, y, new_residual, rstd, block). Without
    a residual, r2 is x2; new_residual is RN(x + r) in the residual's dtype, or RN(x) in ``lp``
    without a residual (``rounded`` True), or y where nothing is written (a placeholder the kernel
    does not touch; see :func:`stores_rounded`)."""
    block = _check_cols(x.shape[-1])
    x2 = _rows(x)
    y = torch.empty(x.shape, dtype=out_dtype or lp, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    r2 = x2 if residual is None else _rows(residual)
    if not stores_rounded(residual, rounded):
        return x2, r2, y, y, rstd, block
    res_dtype = lp if residual is None else x.dtype
    return x2, r2, y, torch.empty(x.shape, dtype=res_dtype, device=x.device), rstd, block


def forward(x, residual, weight, eps: float, per_op: bool, fp32_sum: bool, lp=None, out_dtype=None, rounded=None):
    """-> (y, new_residual or None, rstd [M] fp32). ``residual`` None means plain RMSNorm; ``lp``
    (default x's dtype) is the stack dtype, so an fp32 x can be read as an fp32 residual sum;
    ``out_dtype`` (default lp) is y's: fp32 for a q/k norm whose output RoPE reads unrounded.
    ``rounded`` (:func:`stores_rounded`): False with a residual skips RN(x + r) (None returned in
    its place); True without one also returns RN(x) in ``lp``, from the same read of x."""
    lp = lp or x.dtype
    x2, r2, y, new_res, rstd, block = forward_buffers(x, residual, lp, out_dtype, rounded)
    M, N, store = x2.shape[0], x.shape[-1], stores_rounded(residual, rounded)
    has_res = residual is not None
    if M:
        rows = min(FWD_ROWS, next_pow2(M))
        _norm_fwd_kernel[(cdiv(M, rows),)](
            x2, r2, weight, y, new_res, rstd, M, N, 1.0 / N, eps, x2.stride(0), r2.stride(0),
            HAS_RES=has_res, FP32_SUM=fp32_sum, PER_OP=per_op,
            ROUND_W=weight.dtype == torch.float32 and lp != torch.float32, LP=lp_kind(lp),
            ROWS=rows, BLOCK=block, EV=EVICT, STORE_RES=store, num_warps=_fwd_warps(block * rows), **LAUNCH_OPTS,
        )
    return y, (new_res if store else None), rstd


def backward_tile(M: int, N: int) -> tuple[int, int, int]:
    """(rows per loop step, warps, unroll) of the backward over M rows of N columns. Wide rows:
    ``BWD_ROWS`` rows (at most M's power of two) and ``_bwd_warps``, unroll 1, as tuned at
    3584. Narrow rows (block <= ``NARROW_COLS``): ``BWD_NARROW_WARPS`` warps, 32 * warps / block
    rows (at most M's power of two; fewer rows leave threads holding copies, not more elements),
    unroll ``BWD_UNROLL``. The unroll is the fused q/k backward's (``_triton_qk_norm_rope``): it
    loads that many tiles per step; the norm kernel steps one tile at a time over the same rows."""
    block = next_pow2(max(N, 1))
    if block <= NARROW_COLS:
        rows = min(max(1, 32 * BWD_NARROW_WARPS // block), next_pow2(max(M, 1)))
        return rows, BWD_NARROW_WARPS, BWD_UNROLL
    rows = min(BWD_ROWS, next_pow2(max(M, 1)))
    return rows, _bwd_warps(block * rows), 1


def backward_grid(M: int, N: int, device) -> tuple[int, int, int, int, int]:
    """(rows per loop step, programs, rows per program, warps, unroll) of the persistent backward
    over M rows of N columns (the tile: :func:`backward_tile`). Rows per program is a multiple of
    rows * unroll. The partition decides which rows each d_weight partial sums: the fused q/k norm
    + RoPE backward takes the same one and the same tile, so its d_weight equals this kernel's bit
    for bit. Each partial adds, in row order, one ``tl.sum`` over a tile's rows per loop step
    (fp32, Triton's tree across the tile's rows; one row per step for wide rows); the partials are
    then summed over programs by ``torch.sum(0)``."""
    rows, warps, unroll = backward_tile(M, N)
    step = rows * unroll
    programs = max(1, min(cdiv(M, step), sm_count(device) * BWD_PROGRAMS_PER_SM))
    rows_per_program = max(1, cdiv(cdiv(M, programs), step)) * step  # M = 0: no division by 0
    programs = max(1, cdiv(M, rows_per_program))
    return rows, programs, rows_per_program, warps, unroll


def backward(dy, dres, a, b, weight, rstd, need_dw: bool, lp=None, round_b: bool = False):
    """d_v (in a's dtype) and d_weight (weight's dtype, or None) for v = a (+ b); the stack
    dtype ``lp`` defaults to dy's (an fp32 dy is the gradient of an unrounded q/k norm output).
    ``round_b``: b is an fp32 tensor read as RN(b), rounded to ``lp`` (the second entry)."""
    lp = lp or dy.dtype
    if round_b and (b is None or b.dtype != torch.float32):
        raise TypeError(f"round_b reads an fp32 b, got {None if b is None else b.dtype}")
    N = a.shape[-1]
    block = _check_cols(N)
    dy2, a2 = _rows(dy), _rows(a)
    b2 = _rows(b) if b is not None else a2
    dres2 = _rows(dres) if dres is not None else dy2
    M = a2.shape[0]
    dx = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    rows, programs, rows_per_program, warps, _ = backward_grid(M, N, a.device)
    dw_partial = torch.empty((programs, N), dtype=torch.float32, device=a.device) if need_dw else dx
    if M:
        flags = dict(HAS_DRES=dres is not None, ROUND_W=weight.dtype == torch.float32 and lp != torch.float32,
                     LP=lp_kind(lp), NEED_DW=need_dw, ROWS=rows, BLOCK=block, EV=EVICT, STAGES=BWD_STAGES,
                     num_warps=warps, **LAUNCH_OPTS)
        if round_b:
            kernel = _norm_bwd_rounded_b_kernel
        else:
            kernel, flags["HAS_B"] = _norm_bwd_kernel, b is not None
        kernel[(programs,)](
            dy2, dres2, a2, b2, weight, rstd, dx, dw_partial,
            M, N, 1.0 / N, rows_per_program,
            dy2.stride(0), dres2.stride(0), a2.stride(0), b2.stride(0),
            **flags,
        )
    dw = None
    if need_dw:
        dw = (dw_partial.sum(0) if M else torch.zeros(N, device=a.device)).to(weight.dtype)
    return dx, dw
