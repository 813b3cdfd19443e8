"""``rla.ops.attn_gate``: attn * sigmoid(gate) under the ``attn_gate`` point (docs/rounding.md).

Forward against an independent expression of the point: ``per_op`` as eager PyTorch computes it on lp
tensors (HF's ``attn_output * torch.sigmoid(gate)``), ``fused`` as fp32 arithmetic with one ``.to(lp)``.
Backward against fp64 autograd of attn * sigmoid(gate) on the same (lp) inputs: each gradient within half
an lp ulp of the exact one plus a few fp32 ulps (the spec's one rounding of an fp32 gradient, as
tests/ops/test_backward_oracle.py checks the other ops). On CUDA (skipped here) the same on the device.
"""

from __future__ import annotations

import pytest
import torch

import rla.ops as ops
from rla import profiles

LP = [torch.bfloat16, torch.float16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def _row(value):
    return profiles.get("hf").replace(name=f"gate-{value}", attn_gate=value)


def _inputs(dtype, device="cpu", shape=(3, 5, 64), seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(shape, generator=g).to(dtype).to(device)
    gate = (4 * torch.randn(shape, generator=g)).to(dtype).to(device)
    return attn, gate


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LP)
def test_forward_is_the_point(dtype, device):
    attn, gate = _inputs(dtype, device)
    per_op = attn * torch.sigmoid(gate)  # eager ops on lp tensors: each result rounded
    fused = (attn.float() * torch.sigmoid(gate.float())).to(dtype)
    assert torch.equal(ops.attn_gate(attn, gate, _row("per_op")), per_op)
    assert torch.equal(ops.attn_gate(attn, gate, _row("fused")), fused)
    assert not torch.equal(per_op, fused)  # the two points differ on these inputs
    assert torch.equal(ops.attn_gate(attn, gate, "hf"), per_op)  # hf's variant point: per_op


def test_fp32_inputs_are_not_rounded():
    attn, gate = _inputs(torch.float32)
    want = attn * torch.sigmoid(gate)
    for value in ("per_op", "fused"):
        assert torch.equal(ops.attn_gate(attn, gate, _row(value)), want)


def _ulp(e: torch.Tensor, dtype) -> torch.Tensor:
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    _, exp = torch.frexp(e)
    return torch.ldexp(torch.ones_like(e), exp - bits).clamp_min(torch.finfo(dtype).smallest_normal * 2.0 ** (1 - bits))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", ["per_op", "fused"])
@pytest.mark.parametrize("dtype", LP)
def test_gradients_are_fp64_rounded_once(dtype, value, device):
    """Straight-through the per_op rounding: both points have the exact function's gradient, rounded once."""
    attn, gate = _inputs(dtype, device, seed=1)
    dy = _inputs(dtype, device, seed=2)[0]
    a, g = attn.clone().requires_grad_(), gate.clone().requires_grad_()
    ops.attn_gate(a, g, _row(value)).backward(dy)
    a64, g64 = attn.double().requires_grad_(), gate.double().requires_grad_()
    (a64 * torch.sigmoid(g64)).backward(dy.double())
    for got, exact, name in ((a.grad, a64.grad, "attn"), (g.grad, g64.grad, "gate")):
        assert got.dtype == dtype and exact.abs().max() > 0
        slack = 8 * 2.0**-24 * exact.abs()  # the fp32 arithmetic before the one rounding
        err = (got.double() - exact).abs()
        bad = int((err > 0.5 * _ulp(exact, dtype) + slack).sum())
        assert bad == 0, f"{name}: {bad} of {got.numel()} beyond half an ulp of the fp64 gradient"


def test_a_biased_gradient_fails_the_check():
    """The check above can fail: HF's backward (autograd of the two bf16 ops, every step rounded)
    leaves half an ulp of the exact d_gate in some elements."""
    attn, gate = _inputs(torch.bfloat16, seed=1)
    dy = _inputs(torch.bfloat16, seed=2)[0]
    g = gate.clone().requires_grad_()
    (attn * torch.sigmoid(g)).backward(dy)
    g64 = gate.double().requires_grad_()
    (attn.double() * torch.sigmoid(g64)).backward(dy.double())
    err = (g.grad.double() - g64.grad).abs()
    assert int((err > 0.5 * _ulp(g64.grad, torch.bfloat16) + 8 * 2.0**-24 * g64.grad.abs()).sum()) > 0


def test_only_the_needed_gradient_is_formed():
    attn, gate = _inputs(torch.bfloat16)
    g = gate.clone().requires_grad_()
    ops.attn_gate(attn, g, _row("fused")).sum().backward()
    assert g.grad is not None and g.grad.dtype == torch.bfloat16


def test_bad_inputs_are_clear_errors():
    attn, gate = _inputs(torch.bfloat16)
    with pytest.raises(TypeError, match="attn and gate must share one dtype"):
        ops.attn_gate(attn, gate.float(), "hf")
    with pytest.raises(ValueError, match=r"attn and gate must have the same shape, got \(3, 5, 64\) and \(3, 5, 32\)"):
        ops.attn_gate(attn, gate[..., :32], "hf")
    with pytest.raises(TypeError, match="gate has dtype torch.int64"):
        ops.attn_gate(attn, gate.long(), "hf")
    with pytest.raises(TypeError, match="attn must be a torch.Tensor"):
        ops.attn_gate([1.0], gate, "hf")


def test_compiled_is_eager():
    """Under torch.compile (Dynamo traces the reference Function) the same bits, forward and backward."""
    attn, gate = _inputs(torch.bfloat16, shape=(4, 64))
    row = _row("fused")
    fn = torch.compile(lambda a, g: ops.attn_gate(a, g, row), backend="aot_eager", fullgraph=True)
    a1, g1 = attn.clone().requires_grad_(), gate.clone().requires_grad_()
    a2, g2 = attn.clone().requires_grad_(), gate.clone().requires_grad_()
    out1, out2 = ops.attn_gate(a1, g1, row), fn(a2, g2)
    assert torch.equal(out1, out2)
    out1.float().square().sum().backward()
    out2.float().square().sum().backward()
    assert torch.equal(a1.grad, a2.grad) and torch.equal(g1.grad, g2.grad)
