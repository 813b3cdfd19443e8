"""carry_add's gradient: the fp32 output gradient cast once per distinct input dtype (one cast
kernel, not three, in every aligned layer's backward), the same values as a cast per input."""

from types import SimpleNamespace

import torch

from rla import ops
from rla.ops import fused

BF16 = torch.bfloat16


def test_reference_hands_one_cast_to_the_inputs_of_one_dtype():
    g = torch.Generator().manual_seed(0)
    x, r, m = (torch.randn(3, 40, generator=g).to(BF16).requires_grad_() for _ in range(3))
    out = ops.carry_add(x, r, m, torch.float32)
    dy = torch.randn(3, 40, generator=g)
    dx, dr, dm = torch.autograd.grad(out, (x, r, m), dy)
    assert torch.equal(dx, dy.to(BF16)) and dx.dtype == BF16
    assert dx.data_ptr() == dr.data_ptr() == dm.data_ptr()


def test_fused_grad_rule_casts_each_dtype_once():
    dy = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    ctx = SimpleNamespace(x_dtype=BF16, residual_dtype=torch.float32, m_dtype=BF16)
    dx, dr, dm = fused._carry_add_grad(ctx, None, dy)
    assert dx is dm and dx.dtype == BF16 and torch.equal(dx, dy.to(BF16))
    assert dr.dtype == torch.float32 and torch.equal(dr, dy)
