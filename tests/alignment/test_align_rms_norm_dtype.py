"""``rla.ops.rms_norm(..., dtype=)``: a norm that reads an fp32 residual sum in a bf16 stack.

This is the half of ``add_rms_norm`` that ``rla.align`` needs when the residual add of layer i
and the input norm of layer i+1 live in different modules: layer i hands on the fp32 sum and the
next norm reads it. Its output must equal ``add_rms_norm``'s normed output bit for bit.
"""

import pytest
import torch

import rla.ops
from rla.profiles import get, names

BF16 = torch.bfloat16


def _rn(v):
    return v.to(BF16).float()


def _spec_norm(v, w, eps, per_op):
    """docs/rounding.md written out: v is the fp32 value the norm reads, w the engine's (bf16) weight."""
    rstd = torch.rsqrt((v * v).mean(-1, keepdim=True) + eps)
    wf = w.to(BF16).float()
    out = wf * _rn(v * rstd) if per_op else (v * rstd) * wf
    return out.to(BF16)


@pytest.mark.parametrize("profile", names())
def test_fp32_sum_equals_add_rms_norm(profile):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=g).to(BF16)
    r = (torch.randn(3, 5, 64, generator=g) * 4).to(BF16)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(BF16)
    p = get(profile)
    normed, new_r = rla.ops.add_rms_norm(x, r, w, 1e-6, p)
    v = x.float() + r.float()
    read = v if p.norm_residual == "fp32_sum" else v.to(BF16)
    out = rla.ops.rms_norm(read, w, 1e-6, p, dtype=BF16)
    assert out.dtype == BF16
    assert torch.equal(out, normed)
    assert torch.equal(out, _spec_norm(read.float(), w, 1e-6, p.norm_weight == "per_op"))
    # the spec output is not trivially the plain bf16 norm of the rounded sum everywhere
    if p.norm_residual == "fp32_sum":
        assert not torch.equal(out, rla.ops.rms_norm(new_r, w, 1e-6, "hf"))


def test_fp32_master_weight_is_rounded_to_dtype():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(4, 64, generator=g)
    w32 = 1 + 0.1 * torch.randn(64, generator=g)
    out = rla.ops.rms_norm(v, w32, 1e-6, "vllm", dtype=BF16)
    assert torch.equal(out, rla.ops.rms_norm(v, w32.to(BF16), 1e-6, "vllm", dtype=BF16))


def test_default_dtype_is_unchanged():
    x = torch.randn(4, 64).to(BF16)
    w = torch.ones(64, dtype=BF16)
    assert torch.equal(rla.ops.rms_norm(x, w, 1e-6, "hf"), rla.ops.rms_norm(x, w, 1e-6, "hf", dtype=BF16))


def test_backward_is_the_fp32_gradient():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(4, 64, generator=g, requires_grad=True)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(BF16).requires_grad_()
    dy = torch.randn(4, 64, generator=g).to(BF16)
    out = rla.ops.rms_norm(v, w, 1e-6, "vllm", dtype=BF16)
    (out.float() * dy.float()).sum().backward()
    assert v.grad.dtype == torch.float32 and w.grad.dtype == BF16
    # Oracle: autograd of the unrounded formula in fp64 (roundings are straight-through).
    v64 = v.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = v64 * torch.rsqrt((v64 * v64).mean(-1, keepdim=True) + 1e-6) * w64
    (ref * dy.double()).sum().backward()
    # fp32 arithmetic against an fp64 oracle: 1e-5 relative covers a few fp32 ulps per term.
    torch.testing.assert_close(v.grad.double(), v64.grad, rtol=1e-5, atol=1e-6)
    # The weight gradient is the fp32 gradient rounded once to nearest bf16: within half a bf16
    # ulp of the oracle, plus the fp32 arithmetic's own error (1e-5 relative, as above). A
    # truncated or otherwise mis-rounded gradient is off by up to a whole ulp in about half the
    # elements (rtol=2^-7, "one ulp", let it pass).
    o = w64.grad
    half_ulp = torch.ldexp(torch.ones_like(o), torch.frexp(o)[1] - 9)  # |o| in [2^(e-1), 2^e): ulp 2^(e-8)
    err = (w.grad.double() - o).abs()
    assert (err <= half_ulp + 1e-5 * o.abs() + 1e-12).all(), float((err / half_ulp).max())
    truncated = o.float().view(torch.int32) & ~0xFFFF  # the same gradient, truncated to bf16
    t_err = (truncated.view(torch.float32).double() - o).abs()
    assert (t_err > half_ulp + 1e-5 * o.abs() + 1e-12).any()  # which this bound rejects


def test_bad_dtype_combinations_are_clear():
    x16 = torch.randn(2, 8).to(BF16)
    w = torch.ones(8, dtype=BF16)
    with pytest.raises(TypeError, match="or an fp32 residual sum"):
        rla.ops.rms_norm(x16, w, 1e-6, "vllm", dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype must be one of"):
        rla.ops.rms_norm(x16.float(), w, 1e-6, "vllm", dtype=torch.int8)
    with pytest.raises(TypeError, match="weight is"):
        rla.ops.rms_norm(x16.float(), w.half(), 1e-6, "vllm", dtype=BF16)
