"""The fused q/k norm + RoPE kernel checked on a CPU with Triton installed: its logic under the
interpreter, and its reductions' register layouts in code compiled for the H200.

Logic. 
``TRITON_INTERPRET=1`` runs a kernel's Python body with numpy, so the index arithmetic (rows in
the norm's token-major order, partner columns, half tables, strides of every layout, the
persistent backward's partition of rows and d_weight partials, the one-launch / two-launch split)
can be checked without a GPU: against the two-op chain's own kernels (the norm kernels with an
fp32 output, then the RoPE kernel) run through the same interpreter, bit for bit. The interpreter's
reductions are numpy's, not the GPU's, so this says nothing about the GPU's reduction order; the
bitwise GPU claim is tests/ops/test_fused_gpu.py's.

Layouts. Under ``norm_reduction='unpinned'`` a row's sum of squares is Triton's ``tl.sum``, whose
order follows the register layout of its operand; the fused kernel equals the chain's norm kernels
bit for bit only if its reductions get the same layouts. Both kernels are compiled for sm_90 here
(no GPU needed: Triton's own ptxas) and the layouts of every ``tt.reduce`` compared.

Skipped where Triton is not installed (the CPU CI environment); ~30 s where it is.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

import interpreter_compat
import reduce_layouts
from reduce_layouts import reduces

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")

SCRIPT = textwrap.dedent('''
    import interpreter_compat
    interpreter_compat.fix_scalar_index()
    import torch
    from rla.ops import _triton_norm as N, _triton_norm_tree as T, _triton_qk_norm_rope as F, _triton_rope as R
    from rla.ops.reduction import call_tree

    def same(a, b):
        return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)

    def case(B, S, HQ, HK, D, layout, half, cos_b, reduction, per_op_norm, per_op_rope, wdt, seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(B, S, HQ, D, generator=g) * 4
        k = torch.randn(B, S, HK, D, generator=g) * 4
        if layout == "hf":
            q, k, ax = q.bfloat16().transpose(1, 2), k.bfloat16().transpose(1, 2), 1
        elif layout == "qkv":
            qkv = torch.cat([q.flatten(2), k.flatten(2), k.flatten(2)], -1).bfloat16()
            q = qkv[..., : HQ * D].view(B, S, HQ, D).transpose(1, 2)
            k = qkv[..., HQ * D:(HQ + HK) * D].view(B, S, HK, D).transpose(1, 2)
            ax = 1
        else:
            q, k, ax = q.bfloat16(), k.bfloat16(), 2
        wq, wk = ((torch.rand(D, generator=g) + 0.5).to(wdt) for _ in range(2))
        emb = torch.outer(torch.arange(S, dtype=torch.float32) + seed, 1e-2 * torch.rand(D // 2, generator=g) + 1e-3)
        emb = (emb if half else torch.cat([emb, emb], -1)).expand(cos_b, S, -1)
        cos, sin = emb.cos().bfloat16().contiguous(), emb.sin().bfloat16().contiguous()

        def norm(x, w):
            xt = x.transpose(1, 2) if ax == 1 else x
            if reduction == "vllm_block":
                y, _, r = T.forward(xt, None, w, 1e-6, per_op_norm, False, call_tree(xt, False), torch.bfloat16,
                                    torch.float32)
            else:
                y, _, r = N.forward(xt, None, w, 1e-6, per_op_norm, False, torch.bfloat16, torch.float32)
            return (y.transpose(1, 2) if ax == 1 else y), r.reshape(-1), xt

        (yq, rq, xq), (yk, rk, xk) = norm(q, wq), norm(k, wk)
        oq, ok = R.launch(yq, yk, cos, sin, True, per_op_rope, False, ax, torch.bfloat16)
        got = F.forward(q, k, wq, wk, 1e-6, 1e-6, cos, sin, True, per_op_rope, per_op_norm, reduction, ax)
        assert all(same(a, b) for a, b in zip(got, (oq, ok, rq, rk))), ("forward", layout, reduction)
        gq, gk = torch.randn(oq.shape, generator=g).bfloat16(), torch.randn(ok.shape, generator=g).bfloat16()
        dyq, dyk = R.launch(gq, gk, cos, sin, True, False, True, ax, torch.float32)

        def norm_bwd(dy, x, w, r):
            dx, dw = N.backward(dy.transpose(1, 2) if ax == 1 else dy, None, x, None, w, r.view(x.shape[:-1]), True,
                                torch.bfloat16)
            return (dx.transpose(1, 2) if ax == 1 else dx), dw

        want = (*zip(norm_bwd(dyq, xq, wq, rq), norm_bwd(dyk, xk, wk, rk)),)
        want = (want[0][0], want[0][1], want[1][0], want[1][1])
        got = F.backward(gq, gk, q, k, wq, wk, cos, sin, got[2], got[3], True, ax, True, True)
        assert all(same(a, b) for a, b in zip(got, want)), ("backward", layout, reduction)

    # (the chain's norm backward loops over a tensor bound, which Triton 3.6's interpreter runs
    # only with interpreter_compat's repair under NumPy >= 2.4; an interpreter failure is a failure)
    cases = [
        (2, 5, 4, 2, 64, "hf", True, 1, "unpinned", False, False, torch.bfloat16),
        (2, 5, 4, 2, 64, "qkv", False, 2, "vllm_block", True, False, torch.float32),
        (1, 7, 3, 1, 32, "bshd", True, 1, "unpinned", True, True, torch.float32),
        (1, 3, 2, 1, 96, "hf", False, 1, "vllm_block", False, True, torch.bfloat16),
        (1, 1, 2, 1, 32, "hf", True, 1, "unpinned", False, False, torch.bfloat16),  # q and k: two launches
    ]
    for i, c in enumerate(cases):
        case(*c, seed=i)
    print("ok", len(cases))
''')


def test_fused_kernel_logic_equals_the_chain_kernels_under_the_interpreter():
    env = interpreter_compat.subprocess_env()
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok 5" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]


def _reduce_layouts(found):
    """(operand shape, operand layout) of every tt.reduce in a ``reduce_layouts`` compile."""
    return [(shape, layout) for _, shape, layout in found]


@pytest.mark.parametrize("block", [64, 128, 256])
def test_fused_reductions_take_the_norm_kernels_layouts(block):
    from rla.ops import _triton_norm as N
    from rla.ops import _triton_qk_norm_rope as F

    rows = N.FWD_ROWS
    fwd_warps, bwd_warps = N._fwd_warps(block * rows), N._bwd_warps(block * N.BWD_ROWS)
    i32 = "i32"
    norm_fwd = _reduce_layouts(reduces(
        N._norm_fwd_kernel,
        dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", y_ptr="*fp32", res_ptr="*fp32", rstd_ptr="*fp32",
             M=i32, N=i32, inv_n="fp32", eps="fp32", sx=i32, sr=i32),
        dict(HAS_RES=False, FP32_SUM=False, PER_OP=False, ROUND_W=False, LP=1, ROWS=rows, BLOCK=block, EV=N.EVICT,
             STORE_RES=False),
        ["x_ptr", "r_ptr", "w_ptr", "y_ptr", "res_ptr", "rstd_ptr", "N", "sx", "sr"], fwd_warps))
    sig = {n: "*bf16" for n in ("qa_ptr", "wa_ptr", "oa_ptr", "qb_ptr", "wb_ptr", "ob_ptr", "cos_ptr", "sin_ptr")}
    sig.update(ra_ptr="*fp32", rb_ptr="*fp32", inv_n="fp32", eps_a="fp32", eps_b="fp32")
    strides = ("sab", "sas", "sah", "sbb", "sbs", "sbh", "scs", "N", "HALF")
    sig.update({n: i32 for n in ("PA", "MA", "MB", "HA", "HB", "S", "scb", *strides)})
    fused_fwd = _reduce_layouts(reduces(
        F._fwd_kernel, sig,
        dict(TREE=False, PER_OP_NORM=False, PER_OP_ROPE=False, ROUND_WA=False, ROUND_WB=False, ROUND_CS=True,
             HALF_TABLE=True, LP=1, ROWS=rows, BLOCK=block, EV=N.EVICT, THREADS=1, LANES=32, VEC=1, ROUNDS=1,
             PAIRWISE=False, PV=F._pv(block)),
        [n for n in sig if n.endswith("_ptr")] + list(strides), fwd_warps))
    assert fused_fwd == norm_fwd * 2, (fused_fwd, norm_fwd)  # q's and k's rows, each the norm's tile
    norm_bwd = _reduce_layouts(reduce_layouts.norm_bwd(block, N.BWD_ROWS, bwd_warps))  # the one-row tile
    fused_bwd = _reduce_layouts(reduce_layouts.fused_bwd(block, N.BWD_ROWS, bwd_warps, 1))
    assert fused_bwd == norm_bwd * 2, (fused_bwd, norm_bwd)  # row_grad's sum and d_weight's, for q and k
