"""``rla.ops.rms_norm(x, ..., variance_of=s)``: x normalised by the mean square of another tensor.

Forward: bit for bit an independent expression of the spec (``x * rsqrt(mean(s * s) + eps) * w`` with
the weight's rounding of ``norm_weight`` and the mean square in the row's order, vLLM's kernel order
from ``tests/spec.py`` under ``vllm_block``), and the plain norm bit for bit when ``s`` is ``x``.
Backward: autograd of the same expression in fp64, for ``x`` and ``s`` as independent inputs and for
a training step's ``x = RN(s)`` (straight-through, as ``.to`` differentiates)."""

from __future__ import annotations

import pytest
import torch

from rla import ops, profiles
from spec import vllm_mean_square

BF16 = torch.bfloat16
ROWS = {"hf": profiles.get("hf"), "vllm-0.33": profiles.get("vllm-0.33"),
        "vllm-0.33-eager": profiles.get("vllm-0.33-eager")}  # per_op / fused weight, unpinned / vllm_block order


def _inputs(shape=(3, 5, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g) * 3
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(BF16)
    return s, s.to(BF16), w


def _spec(x, s, w, eps, p, out=None):
    u = s.float()
    if p.norm_reduction == "vllm_block":
        mean_square = vllm_mean_square(u, u.numel() // u.shape[-1], False).reshape(*u.shape[:-1], 1)
    else:
        mean_square = (u * u).mean(-1, keepdim=True)
    n = x.float() * torch.rsqrt(mean_square + eps)
    wf = w.float()
    y = wf * n.to(BF16).float() if p.norm_weight == "per_op" else n * wf
    return y.to(out or BF16)


@pytest.mark.parametrize("name", list(ROWS))
@pytest.mark.parametrize("out", [None, torch.float32])
def test_forward_is_the_spec_and_the_plain_norm_when_s_is_x(name, out):
    p = ROWS[name]
    s, x, w = _inputs()
    got = ops.rms_norm(x, w, 1e-6, p, out_dtype=out, variance_of=s)
    want = _spec(x, s, w, 1e-6, p, out)
    assert got.dtype == (out or BF16) and torch.equal(got, want)
    assert not torch.equal(got, ops.rms_norm(x, w, 1e-6, p, out_dtype=out))  # s is not x: rstd moves
    assert torch.equal(ops.rms_norm(x, w, 1e-6, p, out_dtype=out, variance_of=x.float()),
                       ops.rms_norm(x, w, 1e-6, p, out_dtype=out))
    assert torch.equal(ops.rms_norm(s, w, 1e-6, p, dtype=BF16, variance_of=s), ops.rms_norm(s, w, 1e-6, p, dtype=BF16))


def _fp64(x, s, w, eps):
    return x * torch.rsqrt((s * s).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("name", ["hf", "vllm-0.33"])
def test_backward_is_the_fp64_expressions_gradient_for_both_inputs(name):
    """fp32 inputs (nothing rounds): d_x, d_s, d_w against autograd of the fp64 expression. Tolerance: the
    op's backward is a few fp32 ops and a mean over 40 terms (relative error ~1e-6), fp64's exact."""
    p = ROWS[name]
    s, _, w = _inputs(seed=1)
    x = s + 0.01 * torch.randn(s.shape, generator=torch.Generator().manual_seed(2))  # another tensor than s
    w = w.float()
    g = torch.randn(s.shape, generator=torch.Generator().manual_seed(3))
    x, s, w = (t.clone().requires_grad_() for t in (x, s, w))
    (ops.rms_norm(x, w, 1e-6, p, variance_of=s) * g).sum().backward()
    x64, s64, w64 = (t.detach().double().requires_grad_() for t in (x, s, w))
    (_fp64(x64, s64, w64, 1e-6) * g.double()).sum().backward()
    for name_, a, b in (("x", x, x64), ("s", s, s64), ("w", w, w64)):
        assert a.grad.dtype == torch.float32 and b.grad.abs().max() > 0, name_
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-5, atol=1e-6, msg=name_)


def test_a_training_steps_gradient_through_x_rounded_from_s():
    """x = RN(s) in the graph (``s.to(bf16)``, whose derivative autograd takes as the identity): s's
    gradient is d_x + d_s, d_x rounded once to bf16 (x's dtype) before autograd adds it, against fp64
    autograd of the expression with x = RN(s) an input of its own. Tolerance: an ulp of bf16 of d_x
    (the op rounds its fp32 d_x, the oracle its fp64 one: they may round apart), fp32's 1e-5 elsewhere."""
    p = ROWS["vllm-0.33"]
    s, _, w = _inputs(seed=4)
    g = torch.randn(s.shape, generator=torch.Generator().manual_seed(5))
    s = s.clone().requires_grad_()
    (ops.rms_norm(s.to(BF16), w, 1e-6, p, variance_of=s).float() * g).sum().backward()
    s64 = s.detach().double().requires_grad_()
    x64 = s.detach().to(BF16).double().requires_grad_()
    # the bf16 output's gradient is g rounded to bf16 (autograd of .float())
    (_fp64(x64, s64, w.double(), 1e-6) * g.to(BF16).double()).sum().backward()
    want = x64.grad.to(BF16).double() + s64.grad
    bound = 2 ** -8 * x64.grad.abs() + 1e-5 * (x64.grad.abs() + s64.grad.abs()) + 1e-7
    assert ((s.grad.double() - want).abs() <= bound).all()
    assert (s64.grad.abs() > 2 ** -6 * x64.grad.abs()).any()  # d_s is no rounding error of d_x
    plain = s.detach().clone().requires_grad_()  # not the plain norm's gradient: the centring term reads x
    (ops.rms_norm(plain, w, 1e-6, p, dtype=BF16).float() * g).sum().backward()
    assert not torch.equal(plain.grad, s.grad)


def test_bad_input_is_named():
    s, x, w = _inputs()
    p = ROWS["hf"]
    with pytest.raises(TypeError, match="variance_of must be fp32"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=s.to(BF16))
    with pytest.raises(ValueError, match="x and variance_of must have the same shape"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=s[:, :2])
    with pytest.raises(ValueError, match="^x and variance_of must be on one device, got cpu, meta$"):
        ops.rms_norm(x, w, 1e-6, p, variance_of=torch.zeros_like(s, device="meta"))
    with pytest.raises(NotImplementedError, match="variance_of with weight_offset"):
        ops.rms_norm(x, w, 1e-6, p, weight_offset=1.0, variance_of=s)
