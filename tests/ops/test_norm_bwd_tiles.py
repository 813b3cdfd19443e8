"""The norm backward's narrow-row tile (``_triton_norm.backward_tile``: rows of at most
``NARROW_COLS`` columns, q/k head dims) against the one-row tile every width took before.

What may change and what may not. d_x is computed row by row; the only place the tile can reach
it is the order of a row's ``tl.sum`` (``row_grad``'s mean of dy*w*n), which follows the register
layout of the [ROWS, BLOCK] operand along the row. So:

- Layouts (CPU, Triton installed; compiled for sm_90 with Triton's own ptxas, no GPU): every
  reduction along a row (axis 1) of the narrow tile has the old tile's layout along the row
  (elements per thread, lanes, warps, order), in the norm kernel and in the fused q/k norm + RoPE
  kernel (whose two tiles per step each take the norm's tile); so on the GPU each row is summed
  in the same order and d_x is the old d_x bit for bit. The d_weight sums over rows (axis 0) take
  the new tile: d_weight's summation order changes, equally in both kernels.
- Logic (CPU, ``TRITON_INTERPRET=1``): at M = 0, 1, fewer rows than a tile, and M not divisible by
  a step, d_x from the narrow tile equals the old tile's bit for bit, d_weight agrees with the old
  to fp32 summation order, and the fused q/k backward equals the chain (norm backward after the
  RoPE backward) bit for bit, d_weight included. The interpreter's sums are numpy's, so the
  interpreter checks indices, masks and the partition, not the GPU's order; the GPU tests do.
- GPU (``-m gpu``, skipped elsewhere): the same bitwise claims at a Qwen3-1.7B shape (2 x 4096
  tokens, 16 q heads, 8 k heads, head dim 128; and head dims 64 and 256).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest
import torch

import interpreter_compat
import reduce_layouts
from reduce_layouts import fields

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (its compiler and interpreter)")

# ------------------------------------------------------------------ layouts (CPU)


def _norm_bwd(block, rows, warps, dy):
    """(axis, operand shape, layout fields) of the norm backward's reductions at this tile."""
    return [(axis, shape, fields(layout)) for axis, shape, layout in reduce_layouts.norm_bwd(block, rows, warps, dy)]


def _fused_bwd(block, rows, warps, unroll):
    """The same of the fused q/k norm + RoPE backward's."""
    return [(axis, shape, fields(layout)) for axis, shape, layout in
            reduce_layouts.fused_bwd(block, rows, warps, unroll)]


def _along_row(layout):
    """What a reduction along axis 1 (the row) depends on: the layout's row-axis fields."""
    return layout["spt"][1], layout["tpw"][1], layout["wpc"][1], layout["order"]


@needs_triton
@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_narrow_tile_keeps_the_row_layout_of_the_one_row_tile(block):
    """The old tile is the wide one (BWD_ROWS, BWD_WARPS: one row, 8 warps) at these widths."""
    from rla.ops import _triton_norm as N

    M = 1 << 17  # as many rows as a Qwen3 q call at 2 x 4096 tokens
    rows, warps, unroll = N.backward_tile(M, block)
    assert (rows, warps, unroll) == (max(1, 256 // block), 8, 2)  # one element per thread of 8 warps
    old_rows, old_warps = N.BWD_ROWS, N._bwd_warps(block * N.BWD_ROWS)
    assert (old_rows, old_warps) == (1, 8)
    for dy in ("*fp32", "*bf16"):  # the chain's fp32 RoPE gradient; a bf16 gradient
        old = _norm_bwd(block, old_rows, old_warps, dy)
        new = _norm_bwd(block, rows, warps, dy)
        assert [a for a, _, _ in old] == [a for a, _, _ in new] == [1, 0]  # row_grad's sum, d_weight's
        assert _along_row(new[0][2]) == _along_row(old[0][2]), (dy, old[0], new[0])
        assert new[0][2]["spt"][1] == 1  # one element of the row per thread, as before
    # control: four elements per thread (a four times taller tile) is another row layout
    taller = _norm_bwd(block, 4 * rows, warps, "*bf16")
    assert _along_row(taller[0][2]) != _along_row(old[0][2]), taller[0]
    norm = _norm_bwd(block, rows, warps, "*fp32")
    pair = _fused_bwd(block, rows, warps, unroll)
    # q's two tiles per step, then k's: each tile's row sum and d_weight sum, the norm's layouts
    assert pair == norm * 4, (pair, norm)


# ------------------------------------------------------------------ logic (interpreter)

SCRIPT = textwrap.dedent('''
    import interpreter_compat
    interpreter_compat.fix_scalar_index()
    import torch
    from rla.ops import _triton_norm as N, _triton_qk_norm_rope as F, _triton_rope as R

    def same(a, b):
        return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)

    def old_tile():
        """The tile every width took before: NARROW_COLS below every block."""
        N.NARROW_COLS = 0

    def new_tile():
        N.NARROW_COLS = 256

    def close(a, b, rows):
        # fp32 sums of the same terms in two orders: within rows * 2^-24 of the sum of |terms|
        return bool(((a - b).abs() <= 1e-6 * rows * (a.abs() + b.abs() + 1)).all())

    checks = 0
    g = torch.Generator().manual_seed(0)
    for D in (64, 128, 256):
        rows, _, unroll = N.backward_tile(1 << 20, D)
        step = rows * unroll
        # M = 0, 1, fewer rows than a tile, a ragged step, several steps per program over the
        # interpreter's capped grid of 16 programs with a ragged end (16 * step * 3 + 5), and every
        # program one whole step (16 * step); the old tile takes one row per step, so M is the cost
        for M in sorted({0, 1, max(1, rows - 1), rows + 1, step - 1, 3 * step + 1, 16 * step * 3 + 5, 16 * step}):
            x = (torch.randn(M, D, generator=g) * 3).bfloat16()
            w = torch.rand(D, generator=g) + 0.5  # fp32: d_weight returned unrounded
            dy = torch.randn(M, D, generator=g)  # fp32: the chain's RoPE gradient
            new_tile()
            _, _, rstd = N.forward(x, None, w, 1e-6, False, False, torch.bfloat16, torch.float32)
            dx, dw = N.backward(dy, None, x, None, w, rstd, True, torch.bfloat16)
            old_tile()
            dx0, dw0 = N.backward(dy, None, x, None, w, rstd, True, torch.bfloat16)
            new_tile()
            assert same(dx, dx0), ("norm d_x", D, M)
            assert dw.shape == dw0.shape and close(dw.float(), dw0.float(), max(M, 1)), ("norm d_w", D, M)
            checks += 1

    def qk(B, S, HQ, HK, D, ax):
        q = (torch.randn(B, S, HQ, D, generator=g) * 4).bfloat16()
        k = (torch.randn(B, S, HK, D, generator=g) * 4).bfloat16()
        if ax == 1:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        wq, wk = (torch.rand(D, generator=g) + 0.5 for _ in range(2))  # fp32, as above
        emb = torch.outer(torch.arange(S, dtype=torch.float32), 1e-2 * torch.rand(D // 2, generator=g) + 1e-3)
        emb = torch.cat([emb, emb], -1)[None]
        cos, sin = emb.cos().bfloat16().contiguous(), emb.sin().bfloat16().contiguous()
        fwd = F.forward(q, k, wq, wk, 1e-6, 1e-6, cos, sin, True, False, False, "unpinned", ax)
        gq, gk = torch.randn(fwd[0].shape, generator=g).bfloat16(), torch.randn(fwd[1].shape, generator=g).bfloat16()
        return q, k, wq, wk, cos, sin, fwd[2], fwd[3], gq, gk

    def chain_bwd(q, k, wq, wk, cos, sin, rq, rk, gq, gk, ax):
        dyq, dyk = R.launch(gq, gk, cos, sin, True, False, True, ax, torch.float32)
        out = []
        for dy, x, w, r in ((dyq, q, wq, rq), (dyk, k, wk, rk)):
            xt, dyt = (x.transpose(1, 2), dy.transpose(1, 2)) if ax == 1 else (x, dy)
            dx, dw = N.backward(dyt, None, xt, None, w, r.view(xt.shape[:-1]), True, torch.bfloat16)
            out.append((dx.transpose(1, 2) if ax == 1 else dx, dw))
        return out[0][0], out[1][0], out[0][1], out[1][1]

    # (B, S, HQ, HK, D, head axis): M = B*S*H rows of q and of k; with the interpreter's 16
    # programs, from fewer rows than one tile to several steps per program with a ragged end
    # (2 x 17 x 4 q rows at head dim 128: 12 programs of 3 steps of 4 rows, the last 4 rows; k's
    # 68: 9 programs of 2 steps, the last 4 rows; both more steps than the 16 programs' cap)
    shapes = [(1, 1, 1, 1, 128, 2), (1, 3, 5, 1, 128, 1), (2, 7, 4, 2, 64, 1), (1, 9, 3, 1, 256, 2),
              (2, 17, 4, 2, 128, 1), (1, 0, 2, 1, 128, 1)]
    for B, S, HQ, HK, D, ax in shapes:
        q, k, wq, wk, cos, sin, rq, rk, gq, gk = qk(B, S, HQ, HK, D, ax)
        new_tile()
        got = F.backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, True, ax, True, True)
        want = chain_bwd(q, k, wq, wk, cos, sin, rq, rk, gq, gk, ax)
        assert all(same(a, b) for a, b in zip(got, want)), ("fused vs chain", B, S, HQ, HK, D)
        old_tile()
        old = F.backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, True, ax, True, True)
        new_tile()
        assert same(got[0], old[0]) and same(got[1], old[1]), ("fused d_x vs the one-row tile", B, S, D)
        assert close(got[2].float(), old[2].float(), max(B * S * HQ, 1)), ("d_wq", B, S, D)
        assert close(got[3].float(), old[3].float(), max(B * S * HK, 1)), ("d_wk", B, S, D)
        checks += 1
    print("ok", checks)
''')


@needs_triton
def test_narrow_tile_logic_under_the_interpreter():
    env = interpreter_compat.subprocess_env()
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok " in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    assert int(run.stdout.split("ok ")[-1]) >= 3 * 6 + 6, run.stdout  # every width's M values, every shape


def test_launch_keys_override_the_narrow_tile():
    """``norm.bwd_narrow_warps`` / ``norm.bwd_unroll`` / ``norm.narrow_cols`` reach backward_tile;
    ``norm.bwd_rows`` still sets the wide rows' tile."""
    if not HAS_TRITON:
        pytest.skip("needs Triton (the kernel modules import it)")
    from rla.ops import _triton_norm as N
    from rla.ops import launch_config, set_launch_config

    before = launch_config()
    try:
        assert N.backward_tile(1 << 17, 128) == (2, 8, 2)
        assert N.backward_tile(1 << 17, 2048) == (1, 8, 1)
        set_launch_config({"norm.bwd_narrow_warps": 16, "norm.bwd_unroll": 1})
        assert N.backward_tile(1 << 17, 128) == (4, 16, 1)
        assert N.backward_tile(3, 128) == (4, 16, 1)  # at most M's power of two
        assert N.backward_tile(1, 128) == (1, 16, 1)
        set_launch_config({"norm.bwd_rows": 2})
        assert N.backward_tile(1 << 17, 2048) == (2, 8, 1)
        set_launch_config({"norm.narrow_cols": 64})  # head dim 128 back on the wide tile
        assert N.backward_tile(1 << 17, 128) == (2, 8, 1)
        with pytest.raises(ValueError, match="norm.bwd_unroll must be 1 or 2"):
            set_launch_config({"norm.bwd_unroll": 4})
        grid = N.backward_grid(1000, 128, torch.device("cpu"))
        rows, programs, per_program, _, unroll = grid
        assert per_program % (rows * unroll) == 0 and programs * per_program >= 1000
        assert (programs - 1) * per_program < 1000  # no program without rows
    finally:
        set_launch_config(before)


# ------------------------------------------------------------------ GPU


def _qwen3_qk(D, seed, B=2, S=4096, HQ=16, HK=8):
    """Qwen3-1.7B's q/k at 2 x 4096 tokens in HF's [B, H, S, D] view, fp32 norm weights (the
    master copy; d_weight then comes back in fp32, so its summation order is visible)."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    q = (torch.randn(B, S, HQ, D, device=dev, generator=g) * 4).bfloat16().transpose(1, 2)
    k = (torch.randn(B, S, HK, D, device=dev, generator=g) * 4).bfloat16().transpose(1, 2)
    wq, wk = (torch.rand(D, device=dev, generator=g) + 0.5 for _ in range(2))
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    emb = torch.cat([torch.outer(torch.arange(S, device=dev, dtype=torch.float32), inv)] * 2, -1)[None]
    cos, sin = emb.cos().bfloat16().contiguous(), emb.sin().bfloat16().contiguous()
    gq = torch.randn(B, HQ, S, D, device=dev, generator=g).bfloat16()
    gk = torch.randn(B, HK, S, D, device=dev, generator=g).bfloat16()
    return q, k, wq, wk, cos, sin, gq, gk


def _backwards(q, k, wq, wk, cos, sin, rq, rk, gq, gk):
    """(fused q/k backward, the chain's [(d_x, d_w) of q, of k], the chain's fp32 RoPE gradients)."""
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_qk_norm_rope as F
    from rla.ops import _triton_rope as R

    fused = F.backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, True, 1, True, True)
    dyq, dyk = R.launch(gq, gk, cos, sin, True, False, True, 1, torch.float32)
    chain = []
    for dy, x, w, r in ((dyq, q, wq, rq), (dyk, k, wk, rk)):
        xt, dyt = x.transpose(1, 2), dy.transpose(1, 2)
        chain.append(N.backward(dyt, None, xt, None, w, r.view(xt.shape[:-1]), True, torch.bfloat16))
    return fused, chain, (dyq, dyk)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU and Triton")
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_narrow_tile_bitwise_at_a_qwen3_shape(D, monkeypatch):
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_qk_norm_rope as F

    q, k, wq, wk, cos, sin, gq, gk = _qwen3_qk(D, seed=D)
    _, _, rq, rk = F.forward(q, k, wq, wk, 1e-6, 1e-6, cos, sin, True, False, False, "unpinned", 1)
    new, chain, dys = _backwards(q, k, wq, wk, cos, sin, rq, rk, gq, gk)
    monkeypatch.setattr(N, "NARROW_COLS", 0)  # the one-row tile every width took before
    old, old_chain, _ = _backwards(q, k, wq, wk, cos, sin, rq, rk, gq, gk)
    for i, name in enumerate(("d_q", "d_k")):
        assert torch.equal(new[i].transpose(1, 2), chain[i][0]), f"{name}: fused vs chain"
        assert torch.equal(new[i], old[i]), f"{name}: fused, narrow tile vs the one-row tile"
        assert torch.equal(chain[i][0], old_chain[i][0]), f"{name}: norm backward, narrow vs one-row tile"
        assert torch.equal(new[2 + i], chain[i][1]), f"d_w of {name}: fused vs chain"
        assert new[2 + i].dtype == torch.float32
    # d_weight: another fp32 order than the one-row tile's, no further from fp64 than it was
    # (relative to the sum of |terms| per column; the 1e-6 is test_fused_gpu's order slack)
    for i, (x, r) in enumerate(((q, rq), (k, rk))):
        xt = x.transpose(1, 2).double()
        terms = (dys[i].transpose(1, 2).double() * xt * r.view(xt.shape[:-1]).double()[..., None]).reshape(-1, D)
        exact, scale = terms.sum(0), terms.abs().sum(0)
        err_new = ((new[2 + i].double() - exact).abs() / scale).max().item()
        err_old = ((old[2 + i].double() - exact).abs() / scale).max().item()
        assert err_new <= 1.1 * err_old + 1e-6, (i, err_new, err_old)
