"""Shared by the ops tests that compare register layouts of Triton reductions (CPU, Triton
installed, no GPU: compiled for sm_90 with Triton's own ptxas): the compile-and-read step, and
the norm backward and the fused q/k norm + RoPE backward compiled at a given tile.

``norm_bwd(block, N.BWD_ROWS, N._bwd_warps(block * N.BWD_ROWS))`` is the one-row tile every
width took before ``_triton_norm.backward_tile``'s narrow tile: the reference both
test_norm_bwd_tiles.py and test_qk_norm_rope_triton.py compare against.
"""

from __future__ import annotations

import re

import pytest

_LAYOUT = re.compile(r"sizePerThread = \[(\d+), (\d+)\], threadsPerWarp = \[(\d+), (\d+)\], "
                     r"warpsPerCTA = \[(\d+), (\d+)\], order = \[(\d+), (\d+)\]")


def reduces(fn, sig, consts, divisible, num_warps):
    """(axis, operand shape, operand layout) of every tt.reduce in ``fn`` compiled for sm_90,
    in program order; the layout as TTGIR writes it (``#ttg.blocked<{...}>``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    try:
        src = ASTSource(fn, {n: ("constexpr" if n in consts else sig[n]) for n in names},
                        constexprs={(names.index(k),): v for k, v in consts.items()},
                        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    except TypeError as e:  # another Triton release's ASTSource
        pytest.skip(f"this Triton's ASTSource takes other arguments: {e}")
    ttgir = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": num_warps, "enable_fp_fusion": False}).asm["ttgir"]
    layouts = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*?>)$", ttgir, re.M))
    found = re.findall(r'"tt\.reduce"\(%[\w#]+\) <\{axis = (\d) : i32\}>.*?\}\) : \(tensor<([^>]*), (#\w+)>',
                       ttgir, re.S)
    assert found, "no tt.reduce in the compiled kernel"
    return [(int(axis), shape, layouts[name]) for axis, shape, name in found]


def fields(layout):
    """A blocked layout's fields: spt, tpw, wpc, order, each a pair."""
    m = _LAYOUT.search(layout)
    assert m, layout
    spt0, spt1, tpw0, tpw1, wpc0, wpc1, o0, o1 = map(int, m.groups())
    return dict(spt=(spt0, spt1), tpw=(tpw0, tpw1), wpc=(wpc0, wpc1), order=(o0, o1))


def norm_bwd(block, rows, warps, dy="*fp32"):
    """``reduces`` of the norm backward kernel (``_norm_bwd_kernel``: bf16 input and weight, no
    residual gradient, d_weight wanted) at the tile (rows, warps), its dy in ``dy``'s type."""
    from rla.ops import _triton_norm as N

    i32 = "i32"
    return reduces(
        N._norm_bwd_kernel,
        dict(dy_ptr=dy, dres_ptr="*fp32", a_ptr="*bf16", b_ptr="*bf16", w_ptr="*bf16", rstd_ptr="*fp32",
             dx_ptr="*bf16", dw_ptr="*fp32", M=i32, N=i32, inv_n="fp32", rows_per_program=i32,
             sdy=i32, sdres=i32, sa=i32, sb=i32),
        dict(HAS_DRES=False, HAS_B=False, ROUND_W=False, LP=1, NEED_DW=True, ROWS=rows, BLOCK=block, EV=N.EVICT,
             STAGES=N.BWD_STAGES),
        ["dy_ptr", "dres_ptr", "a_ptr", "b_ptr", "w_ptr", "rstd_ptr", "dx_ptr", "dw_ptr",
         "N", "sdy", "sdres", "sa", "sb"],
        warps)


def fused_bwd(block, rows, warps, unroll):
    """``reduces`` of the fused q/k norm + RoPE backward (``_bwd_kernel``) at the tile (rows,
    warps) and ``unroll`` tiles per loop step: q's tiles, then k's."""
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_qk_norm_rope as F

    i32 = "i32"
    sig = {n: "*bf16" for n in ("ga_ptr", "xa_ptr", "wa_ptr", "dxa_ptr", "gb_ptr", "xb_ptr", "wb_ptr", "dxb_ptr",
                                "cos_ptr", "sin_ptr")}
    sig.update(ra_ptr="*fp32", rb_ptr="*fp32", dwa_ptr="*fp32", dwb_ptr="*fp32", inv_n="fp32")
    strides = ("gab", "gas", "gah", "xab", "xas", "xah", "gbb", "gbs", "gbh", "xbb", "xbs", "xbh", "scs", "N", "HALF")
    sig.update({n: i32 for n in ("PA", "MA", "MB", "RPA", "RPB", "HA", "HB", "S", "scb", *strides)})
    return reduces(
        F._bwd_kernel, sig,
        dict(ROUND_WA=False, ROUND_WB=False, ROUND_CS=True, HALF_TABLE=True, LP=1, NEED_DWA=True, NEED_DWB=True,
             ROWS=rows, BLOCK=block, EV=N.EVICT, STAGES=N.BWD_STAGES, PV=F._pv(block), UNROLL=unroll),
        [n for n in sig if n.endswith("_ptr")] + list(strides), warps)
