"""``add_rms_norm(new_residual=False)``: the add + norm without RN(x + r), which an aligned layer
under ``fp32_carry`` never reads. ``normed`` and every gradient must be the bits of the two-output
op whose residual output is left unused (what the layer ran before), with and without a
``residual_source``:

- the reference (the CPU path) under every ``fp32_sum`` row, bf16 / fp16, fp32 master weights, the
  zero-centred norm; the saved tensors are the two-output op's; under ``rounded_sum`` the flag only
  drops the returned output;
- the fused ops under Triton's interpreter: the two new ops against the two old ones (their first
  output), forward and backward, both reductions, and that the kernel writes no residual;
- on a GPU (``gpu`` marks): the compiled kernels, and ``opcheck`` of the two new custom ops.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from interpreted_scripts import leaf, needs_cuda, needs_triton, run_script, source_inputs, tail
from rla import ops, profiles

BF16 = torch.bfloat16
FP32_SUM = [n for n in ("vllm", "rla", "sglang") if profiles.get(n).norm_residual == "fp32_sum"]


def _run(new, profile, dtype=BF16, wdtype=BF16, offset=0.0, source=False, device="cpu", seed=0, rows=6, hidden=64):
    """-> (normed, d_x, d_r, d_w) and the storages kept for backward."""
    g = torch.Generator(device=device).manual_seed(seed)
    s = torch.randn(rows, hidden, generator=g, device=device) * 3
    x = torch.randn(rows, hidden, generator=g, device=device).to(dtype).requires_grad_(True)
    r = s.to(dtype).requires_grad_(True)
    w = (1 + 0.2 * torch.randn(hidden, generator=g, device=device)).to(wdtype).requires_grad_(True)
    dy = torch.randn(rows, hidden, generator=g, device=device).to(dtype)
    kw = dict(weight_offset=offset, **(dict(residual_source=s) if source else {}))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, tuple(t.shape))) or t, lambda t: t):
        if new:
            y = ops.add_rms_norm(x, r, w, 1e-6, profile, new_residual=False, **kw)
        else:
            y, _ = ops.add_rms_norm(x, r, w, 1e-6, profile, **kw)
    y.backward(dy)
    return (y.detach(), x.grad, r.grad, w.grad), saved


def _assert_equal(a, b, what):
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.dtype == v.dtype and torch.equal(u, v), f"{what}: output/gradient {i} differs"
    assert all(t.abs().sum() > 0 for t in a), f"{what}: an all-zero output or gradient proves nothing"


@pytest.mark.parametrize("name", FP32_SUM)
@pytest.mark.parametrize("source", [False, True], ids=["r", "source"])
@pytest.mark.parametrize("dtype,wdtype,offset", [(BF16, BF16, 0.0), (torch.float16, torch.float32, 0.0),
                                                 (BF16, torch.float32, 1.0)])
def test_reference_equals_the_two_output_op_bitwise(name, source, dtype, wdtype, offset):
    (new, saved_new), (old, saved_old) = (_run(n, name, dtype, wdtype, offset, source) for n in (True, False))
    assert isinstance(new[0], torch.Tensor)
    _assert_equal(new, old, name)
    assert saved_new == saved_old  # the same tensors kept (x, r or its source, the weight, rstd)


def test_rounded_sum_only_drops_the_output():
    (new, saved_new), (old, saved_old) = _run(True, "vllm-eager"), _run(False, "vllm-eager")
    _assert_equal(new, old, "vllm-eager")
    assert saved_new == saved_old  # the rounded sum the norm read is kept as before


# ------------------------------------------------------------------ the kernels under the interpreter

SCRIPT = textwrap.dedent('''
    from rla.ops import fused, _triton_norm as N

    def run(door, tensors, flags, grads, dy):
        leaves = [t.detach().clone().requires_grad_(i in grads) for i, t in enumerate(tensors)]
        out = door(*leaves, **flags)
        y = out if isinstance(out, torch.Tensor) else out[0]
        y.backward(dy)
        return [y.detach()] + [t.grad for t in leaves]

    n = 0
    for rows, hidden, lp, wdt, per_op, reduction, need_dw, seed in (
            (6, 64, torch.bfloat16, torch.bfloat16, False, "unpinned", True, 0),
            (7, 48, torch.bfloat16, torch.float32, True, "vllm_block", True, 1),
            (5, 96, torch.float16, torch.float32, False, "unpinned", False, 2)):
        g = torch.Generator().manual_seed(seed)
        s = below_half(torch.randn(rows, hidden, generator=g) * 3, g)
        x = torch.randn(rows, hidden, generator=g).to(lp)
        w = (1 + 0.2 * torch.randn(hidden, generator=g)).to(wdt)
        r = s.to(lp)
        dy = torch.randn(rows, hidden, generator=g).to(lp)
        flags = dict(eps=1e-6, per_op=per_op, reduction=reduction)
        grads = (0, 1, 2) if need_dw else (0, 1)
        new = run(fused._ADD_RMS_NORM_NORMED, (x, r, w), flags, grads, dy)
        old = run(fused._ADD_RMS_NORM, (x, r, w), dict(flags, fp32_sum=True), grads, dy)
        src = (0, 1, 3) if need_dw else (0, 1)
        new_s = run(fused._ADD_RMS_NORM_OF_SOURCE_NORMED, (x, r, s, w), flags, src, dy)
        old_s = run(fused._ADD_RMS_NORM_OF_SOURCE, (x, r, s, w), flags, src, dy)
        for a, b in zip(new + new_s, old + old_s):
            assert (a is None and b is None) or same(a, b), (seed, reduction)
        assert new[1].abs().sum() > 0
        n += 1
    # the kernels write no residual: the launcher returns None in its place
    y, res, rstd = N.forward(x, r, w, 1e-6, False, True, rounded=False)
    assert res is None and same(y, fused._ADD_RMS_NORM(x, r, w, eps=1e-6, per_op=False, fp32_sum=True,
                                                        reduction="unpinned")[0])
    print("ok", n + 1)
''')


@needs_triton
def test_fused_ops_equal_the_two_output_ops_under_the_interpreter():
    run = run_script(SCRIPT)
    assert run.returncode == 0 and run.stdout.startswith("ok 4"), tail(run)


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", FP32_SUM)
@pytest.mark.parametrize("source", [False, True], ids=["r", "source"])
@pytest.mark.parametrize("dtype,wdtype", [(BF16, BF16), (BF16, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (777, 1536), (4096, 3584)], ids=str)
def test_fused_equals_the_two_output_op_bitwise_gpu(name, source, dtype, wdtype, rows, hidden):
    assert ops.backend(torch.zeros(1, device="cuda")).__name__ == "rla.ops.fused"
    kw = dict(dtype=dtype, wdtype=wdtype, source=source, device="cuda", rows=rows, hidden=hidden)
    (new, saved_new), (old, saved_old) = _run(True, name, **kw), _run(False, name, **kw)
    _assert_equal(new, old, f"{name} {dtype} {wdtype} {rows}x{hidden}")
    assert saved_new == saved_old


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("per_op,reduction,wdtype", [(False, "unpinned", BF16), (True, "vllm_block", torch.float32)])
def test_opcheck_gpu(per_op, reduction, wdtype):
    from rla.ops import fused  # noqa: F401  (registers the ops)

    s, x, w, _ = source_inputs(wdtype)
    torch.library.opcheck(torch.ops.rla.add_rms_norm_normed.default,
                          (leaf(x), leaf(s.to(BF16)), leaf(w), 1e-6, per_op, reduction))
    torch.library.opcheck(torch.ops.rla.add_rms_norm_of_source_normed.default,
                          (leaf(x), leaf(s.to(BF16)), s, leaf(w), 1e-6, per_op, reduction))
