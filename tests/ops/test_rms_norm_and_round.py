"""``rla.ops.rms_norm_and_round``: (rms_norm(s), s.to(lp)) as one op, the same bits as the two ops.

The two ops it replaces in an aligned layer i > 0 under ``fp32_sum`` are the input norm of the fp32
sum s and the cast of s to the residual RN(s). Every test compares with those two ops, which is
what the layer ran before (autograd adds the two gradients of s in fp32):

- the reference (the CPU path): outputs and the gradients of s and the weight under every profile
  row, bf16 / fp16, fp32 master weights, the zero-centred norm, with both upstream gradients or
  one; what is kept for backward (what ``rms_norm`` alone keeps: s, the weight, rstd);
- the fused op under Triton's interpreter (CPU tensors): against the fused ``rms_norm`` plus the
  cast, forward and backward, both reductions;
- on a GPU (``gpu`` marks): the compiled kernels against the fused two-op composition, bit for
  bit, and ``torch.library.opcheck`` of the new custom op.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from interpreted_scripts import leaf, needs_cuda, needs_triton, run_script, tail
from profile_rows import DISTINCT
from rla import ops, profiles
from saved_memory import saved_bytes

BF16 = torch.bfloat16
ROWS = sorted(set(DISTINCT) | {n for n in ("vllm", "rla", "sglang") if profiles.get(n).norm_residual == "fp32_sum"})


def _inputs(dtype, wdtype, device="cpu", seed=0, rows=6, hidden=64):
    g = torch.Generator(device=device).manual_seed(seed)
    s = torch.randn(rows, hidden, generator=g, device=device) * 3
    w = (1 + 0.2 * torch.randn(hidden, generator=g, device=device)).to(wdtype)
    dh = torch.randn(rows, hidden, generator=g, device=device).to(dtype)
    dr = torch.randn(rows, hidden, generator=g, device=device).to(dtype)
    return s, w, dh, dr


def _run(fused_op, profile, s, w, dh, dr, dtype, offset=0.0, after_add=True):
    """-> (h, r, d_s, d_w), the upstream gradients (dh, dr) either given or None (left out)."""
    s, w = s.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    if fused_op:
        h, r = ops.rms_norm_and_round(s, w, 1e-6, profile, dtype=dtype, after_add=after_add, weight_offset=offset)
    else:  # the layer's two ops before the change
        r = s.to(dtype)
        h = ops.rms_norm(s, w, 1e-6, profile, dtype=dtype, after_add=after_add, weight_offset=offset)
    outs = [(o, g) for o, g in ((h, dh), (r, dr)) if g is not None]
    torch.autograd.backward([o for o, _ in outs], [g for _, g in outs])
    return h.detach(), r.detach(), s.grad, w.grad


def _assert_equal(a, b, what):
    for i, (u, v) in enumerate(zip(a, b)):
        if u is None or v is None:
            assert u is None and v is None, f"{what}: {i} is None on one side only"
            continue
        assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v), f"{what}: output/gradient {i} differs"


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("dtype,wdtype,offset", [(BF16, BF16, 0.0), (torch.float16, torch.float32, 0.0),
                                                 (BF16, torch.float32, 0.0), (BF16, BF16, 1.0)])
def test_reference_equals_the_two_ops_bitwise(name, dtype, wdtype, offset):
    s, w, dh, dr = _inputs(dtype, wdtype)
    new = _run(True, name, s, w, dh, dr, dtype, offset)
    old = _run(False, name, s, w, dh, dr, dtype, offset)
    _assert_equal(new, old, name)
    assert new[1].dtype == dtype and torch.equal(new[1], s.to(dtype))
    # d_s has both terms: not the norm's gradient alone, nor the cast's
    norm_only = _run(True, name, s, w, dh, None, dtype, offset)[2]
    assert not torch.equal(new[2], norm_only) and not torch.equal(new[2], dr.float())


@pytest.mark.parametrize("upstream", ["norm only", "rounded only"])
def test_reference_with_one_upstream_gradient(upstream):
    s, w, dh, dr = _inputs(BF16, BF16, seed=3)
    dh, dr = (dh, None) if upstream == "norm only" else (None, dr)
    _assert_equal(_run(True, "vllm", s, w, dh, dr, BF16), _run(False, "vllm", s, w, dh, dr, BF16), upstream)


def test_reference_not_after_add_and_lp_input():
    s, w, dh, dr = _inputs(BF16, BF16, seed=4)
    _assert_equal(_run(True, "vllm-eager", s, w, dh, dr, BF16, after_add=False),
                  _run(False, "vllm-eager", s, w, dh, dr, BF16, after_add=False), "plain norm, vllm_block")
    h, r = ops.rms_norm_and_round(s.to(BF16), w, 1e-6, "vllm")  # an lp input: its rounding is a copy
    assert torch.equal(r, s.to(BF16)) and r.data_ptr() != s.data_ptr()


def test_keeps_what_rms_norm_keeps():
    s, w, _, _ = _inputs(BF16, BF16)
    s.requires_grad_(True)
    w.requires_grad_(True)
    new = saved_bytes(lambda s, w: ops.rms_norm_and_round(s, w, 1e-6, "vllm", dtype=BF16, after_add=True), (s, w))
    old = saved_bytes(lambda s, w: (s.to(BF16), ops.rms_norm(s, w, 1e-6, "vllm", dtype=BF16, after_add=True)), (s, w))
    assert new == old == 4 * s.shape[0]  # one fp32 rstd per row beyond the inputs; RN(s) is not kept


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(TypeError, match="stack dtype"):
        ops.rms_norm_and_round(torch.zeros(2, 8, dtype=BF16), torch.ones(8), 1e-6, "vllm", dtype=torch.float16)
    with pytest.raises(ValueError, match="weight_offset"):
        ops.rms_norm_and_round(torch.zeros(2, 8), torch.ones(8), 1e-6, "vllm", dtype=BF16, weight_offset=2.0)


# ------------------------------------------------------------------ the kernels under the interpreter

SCRIPT = textwrap.dedent('''
    from rla.ops import fused

    def run(new, s, w, flags, dh, dr, need_dw):
        s, w = s.clone().requires_grad_(True), w.clone().requires_grad_(need_dw)
        if new:
            h, r = fused._RMS_NORM_AND_ROUND(s, w, **flags)
        else:
            r = s.to(flags["lp"])
            h = fused._RMS_NORM(s, w, eps=flags["eps"], per_op=flags["per_op"], lp=flags["lp"], out_dtype=flags["lp"],
                                reduction=flags["reduction"], after_add=flags["after_add"])
        torch.autograd.backward((h, r), (dh, dr))
        return [h.detach(), r.detach(), s.grad, w.grad]

    n = 0
    for rows, hidden, lp, wdt, per_op, reduction, after_add, need_dw, seed in (
            (6, 64, torch.bfloat16, torch.bfloat16, False, "unpinned", True, True, 0),
            (7, 48, torch.bfloat16, torch.float32, True, "vllm_block", True, True, 1),
            (5, 96, torch.float16, torch.float32, False, "unpinned", True, False, 2),
            (3, 64, torch.bfloat16, torch.bfloat16, False, "vllm_block", False, True, 3),
            (1, 32, torch.bfloat16, torch.bfloat16, True, "unpinned", True, True, 4)):
        g = torch.Generator().manual_seed(seed)
        s = below_half(torch.randn(rows, hidden, generator=g) * 3, g)
        w = (1 + 0.2 * torch.randn(hidden, generator=g)).to(wdt)
        dh, dr = (torch.randn(rows, hidden, generator=g).to(lp) for _ in range(2))
        flags = dict(eps=1e-6, per_op=per_op, lp=lp, reduction=reduction, after_add=after_add)
        new, old = run(True, s, w, flags, dh, dr, need_dw), run(False, s, w, flags, dh, dr, need_dw)
        for i, (a, b) in enumerate(zip(new, old)):
            assert (a is None and b is None) or same(a, b), (seed, i)
        assert not torch.equal(new[1].float(), s) and new[2].abs().sum() > 0
        n += 1
    print("ok", n)
''')


@needs_triton
def test_fused_op_equals_the_two_fused_ops_under_the_interpreter():
    run = run_script(SCRIPT)
    assert run.returncode == 0 and run.stdout.startswith("ok 5"), tail(run)


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("dtype,wdtype", [(BF16, BF16), (BF16, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (777, 1536), (4096, 3584)], ids=str)
def test_fused_equals_the_two_ops_bitwise_gpu(name, dtype, wdtype, rows, hidden):
    assert ops.backend(torch.zeros(1, device="cuda")).__name__ == "rla.ops.fused"
    s, w, dh, dr = _inputs(dtype, wdtype, "cuda", rows=rows, hidden=hidden)
    _assert_equal(_run(True, name, s, w, dh, dr, dtype), _run(False, name, s, w, dh, dr, dtype),
                  f"{name} {dtype} {wdtype} {rows}x{hidden}")
    s.requires_grad_(True)
    w.requires_grad_(True)
    new = saved_bytes(lambda s, w: ops.rms_norm_and_round(s, w, 1e-6, name, dtype=dtype, after_add=True), (s, w))
    assert new == 4 * rows


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("per_op,reduction,wdtype,after_add",
                         [(False, "unpinned", BF16, True), (True, "vllm_block", torch.float32, True),
                          (False, "vllm_block", BF16, False)])
def test_opcheck_gpu(per_op, reduction, wdtype, after_add):
    from rla.ops import fused  # noqa: F401  (registers the ops)

    s, w, _, _ = _inputs(BF16, wdtype, "cuda", rows=16, hidden=96)
    torch.library.opcheck(torch.ops.rla.rms_norm_and_round.default,
                          (leaf(s), leaf(w), 1e-6, per_op, BF16, reduction, after_add))
