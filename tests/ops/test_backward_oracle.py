"""Gradients of every op under every profile against fp64 autograd of the spec.

The spec of the backward (``rla/ops/reference.py``'s docstring): the profile only moves roundings
of the forward; the backward treats every rounding *inside* a region as the identity
(straight-through), computes each gradient in fp32 and rounds it once to its input's dtype. What a
region *reads* is a value, not a rounding to skip: the cos/sin tables (rounded to ``lp`` where
``rope_cos_sin = round``), the engine's copy of the weight (RN(w) for an fp32 master weight) and,
under ``norm_residual = rounded_sum``, the rounded residual RN(x + r) that the norm reads.

The oracle below is written here, independently of ``rla.ops`` and of ``tests/spec.py``: the
region's function in fp64, with the values it reads, differentiated by fp64 autograd. The exact
gradient ``e`` (fp64) is then compared with the op's rounded gradient ``g``:

    |g - e| <= ulp(e) / 2 + slack

``ulp(e)/2`` is the one final rounding the spec allows (bf16: 2^-8 relative, fp16: 2^-11). The
``slack`` bounds the fp32 arithmetic of the op before that rounding (a few fp32 ulps, 2^-24
relative, of the sum of the magnitudes of the terms; Higham's gamma_n for the sums over a row).
It is ~2^-20 relative or less, so a gradient biased by 2^-11 relative (1/16 of a bf16 ulp) leaves
the allowed half ulp in about 1 element in 16 and fails; ``test_oracle_rejects_small_bias`` shows
that with the same check. So does a RoPE backward that uses the fp32 cos/sin where the forward
rounded them (a 2^-9 relative change).
"""

import pytest
import torch

import rla.ops as ops
from rla import profiles

from profile_rows import DISTINCT  # noqa: E402

PROFILES = DISTINCT  # each way of rounding once (tests/profile_rows.py)
LP = [torch.bfloat16, torch.float16]
U32 = 2.0**-24  # fp32 unit roundoff


def _mantissa_bits(dtype):
    return {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]


def _ulp(e: torch.Tensor, dtype) -> torch.Tensor:
    """Spacing of ``dtype`` numbers in the binade of ``e`` (fp64), subnormal floor included."""
    _, exp = torch.frexp(e)
    ulp = torch.ldexp(torch.ones_like(e), exp - _mantissa_bits(dtype))
    return ulp.clamp_min(torch.finfo(dtype).smallest_normal * 2.0 ** (1 - _mantissa_bits(dtype)))


def violations(got: torch.Tensor, exact: torch.Tensor, slack: torch.Tensor) -> int:
    """Number of elements of ``got`` farther from ``exact`` than half an ulp plus ``slack``."""
    err = (got.double() - exact).abs()
    return int((err > 0.5 * _ulp(exact, got.dtype) + slack).sum())


def assert_close_to_oracle(got, exact, slack, what):
    assert got.shape == exact.shape, what
    assert exact.abs().max() > 0, f"{what}: the oracle gradient is zero; the test checks nothing"
    n = violations(got, exact, slack)
    assert n == 0, f"{what}: {n} of {got.numel()} elements beyond half an ulp of the fp64 gradient"


def _rn(t64: torch.Tensor, lp) -> torch.Tensor:
    """A value the region reads, rounded to ``lp`` (exact in fp64)."""
    return t64.to(lp).double()


# ------------------------------------------------------------------------------------------ RoPE


def _rotate(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _tables(b, s, d, theta=1e6, offset=900):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    pos = torch.arange(offset, offset + s, dtype=torch.float32)[None, :].expand(b, s)
    emb = torch.cat([pos[..., None] * inv_freq] * 2, dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("lp", LP, ids=str)
def test_rope_backward_oracle(name, lp):
    prof = profiles.get(name)
    g = torch.Generator().manual_seed(11)
    b, hq, hk, s, d = 2, 4, 2, 33, 64
    q = torch.randn(b, hq, s, d, generator=g).to(lp).requires_grad_(True)
    k = torch.randn(b, hk, s, d, generator=g).to(lp).requires_grad_(True)
    cos, sin = _tables(b, s, d)
    dq_out = torch.randn(q.shape, generator=g).to(lp)
    dk_out = torch.randn(k.shape, generator=g).to(lp)
    torch.autograd.backward(ops.rope(q, k, cos, sin, name), (dq_out, dk_out))

    c, sn = cos.double()[:, None], sin.double()[:, None]
    if prof.rope_cos_sin == "round":
        c, sn = _rn(c, lp), _rn(sn, lp)
    for x, up, got, what in ((q, dq_out, q.grad, "dq"), (k, dk_out, k.grad, "dk")):
        x64 = x.detach().double().requires_grad_(True)
        out = x64 * c + _rotate(x64) * sn
        (exact,) = torch.autograd.grad(out, x64, up.double())
        # fp32 backward: g*c + rot^T(g*s), two products and one add -> 3 roundings of the terms
        terms = up.double().abs() * c.abs() + _rotate(up.double().abs() * sn.abs()).abs()
        assert_close_to_oracle(got, exact, 3 * U32 * terms, f"{name} {lp} rope {what}")


# ---------------------------------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("lp", LP, ids=str)
def test_swiglu_backward_oracle(name, lp):
    g = torch.Generator().manual_seed(12)
    shape = (6, 37, 96)
    gate = (torch.randn(shape, generator=g) * 3).to(lp).requires_grad_(True)
    up = torch.randn(shape, generator=g).to(lp).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(lp)
    ops.swiglu(gate, up, name).backward(dy)

    g64 = gate.detach().double().requires_grad_(True)
    u64 = up.detach().double().requires_grad_(True)
    out = g64 / (1.0 + torch.exp(-g64)) * u64  # silu written out; per_op's RN is straight-through
    dgate, dup = torch.autograd.grad(out, (g64, u64), dy.double())

    gd, ud, dyd = gate.detach().double(), up.detach().double(), dy.double()
    sig = torch.sigmoid(gd)
    # fp32: sigmoid (a few ulps) and ~6 products/adds; 1 + g(1-sig) cancels near g = -1.28, so the
    # slack is relative to the magnitudes of its terms, not to the result.
    mag_gate = (dyd * ud).abs() * sig * (1.0 + gd.abs() * (1.0 - sig))
    mag_up = (dyd * gd * sig).abs()
    assert_close_to_oracle(gate.grad, dgate, 16 * U32 * mag_gate, f"{name} {lp} swiglu dgate")
    assert_close_to_oracle(up.grad, dup, 8 * U32 * mag_up, f"{name} {lp} swiglu dup")


# --------------------------------------------------------------------------------------- RMSNorm


def _norm64(v, w, eps):
    """RMSNorm in fp64: (v * rsqrt(mean(v^2) + eps)) * w; per_op's RN(n) is straight-through."""
    rstd = 1.0 / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)
    return v * rstd * w


def _norm_slacks(v, w, dy, dim):
    """fp32 error bounds of the op's dv = rstd*(dy*w - n*mean(dy*w*n)) and dw = sum(dy*n).

    rstd comes from a sum of ``dim`` squares (gamma_dim relative), the mean of ``dim`` products
    likewise; the weight gradient sums over every row (gamma_rows of the sum of magnitudes).
    """
    rstd = 1.0 / torch.sqrt((v * v).mean(-1, keepdim=True))
    n = v * rstd
    dyw = (dy * w).abs()
    mag_v = rstd * (dyw + n.abs() * (dyw * n.abs()).mean(-1, keepdim=True))
    rows = v.numel() // dim
    mag_w = (dy * n).abs().reshape(-1, dim).sum(0)
    return 2 * (dim + 8) * U32 * mag_v, (rows + 4) * U32 * mag_w


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("lp", LP, ids=str)
@pytest.mark.parametrize("w_dtype", ["lp", torch.float32], ids=["w_lp", "w_fp32"])
def test_rms_norm_backward_oracle(name, lp, w_dtype):
    g = torch.Generator().manual_seed(13)
    shape, dim, eps = (3, 29, 128), 128, 1e-6
    w_dtype = lp if w_dtype == "lp" else w_dtype
    x = (torch.randn(shape, generator=g) * 2).to(lp).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(dim, generator=g)).to(w_dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(lp)
    ops.rms_norm(x, w, eps, name).backward(dy)

    x64 = x.detach().double().requires_grad_(True)
    w_read = w.detach().double()
    w64 = (_rn(w_read, lp) if w_dtype == torch.float32 else w_read).requires_grad_(True)
    dx, dw = torch.autograd.grad(_norm64(x64, w64, eps), (x64, w64), dy.double())
    s_x, s_w = _norm_slacks(x64.detach(), w64.detach(), dy.double(), dim)
    assert_close_to_oracle(x.grad, dx, s_x, f"{name} {lp} rms_norm dx")
    assert_close_to_oracle(w.grad, dw, s_w, f"{name} {lp} rms_norm dw ({w_dtype})")


@pytest.mark.parametrize("name", PROFILES)
def test_rms_norm_fp32_sum_input_backward_oracle(name):
    """An fp32 x read as the fp32 residual sum (``dtype=bf16``): the gradient stays fp32."""
    g = torch.Generator().manual_seed(14)
    shape, dim, eps, lp = (4, 11, 64), 64, 1e-5, torch.bfloat16
    x = (torch.randn(shape, generator=g) * 2).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(dim, generator=g)).to(lp).requires_grad_(True)
    dy = torch.randn(shape, generator=g).to(lp)
    ops.rms_norm(x, w, eps, name, dtype=lp).backward(dy)

    x64 = x.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    dx, dw = torch.autograd.grad(_norm64(x64, w64, eps), (x64, w64), dy.double())
    s_x, s_w = _norm_slacks(x64.detach(), w64.detach(), dy.double(), dim)
    assert x.grad.dtype == torch.float32
    assert_close_to_oracle(x.grad, dx, s_x, f"{name} fp32-sum rms_norm dx")
    assert_close_to_oracle(w.grad, dw, s_w, f"{name} fp32-sum rms_norm dw")


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("lp", LP, ids=str)
def test_add_rms_norm_backward_oracle(name, lp):
    prof = profiles.get(name)
    g = torch.Generator().manual_seed(15)
    shape, dim, eps = (3, 21, 96), 96, 1e-6
    x = torch.randn(shape, generator=g).to(lp).requires_grad_(True)
    r = (torch.randn(shape, generator=g) * 4).to(lp).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(dim, generator=g)).to(torch.float32).requires_grad_(True)
    d_normed = torch.randn(shape, generator=g).to(lp)
    d_resid = torch.randn(shape, generator=g).to(lp)
    torch.autograd.backward(ops.add_rms_norm(x, r, w, eps, name), (d_normed, d_resid))

    x64 = x.detach().double().requires_grad_(True)
    r64 = r.detach().double().requires_grad_(True)
    total = x64 + r64  # exact in fp64 (and in fp32) for these lp inputs
    if prof.norm_residual == "rounded_sum":  # the norm reads RN(x + r); d/d(x, r) is identity
        v = total + (_rn(total.detach(), lp) - total.detach())
    else:
        v = total
    w64 = _rn(w.detach().double(), lp).requires_grad_(True)
    normed = _norm64(v, w64, eps)
    dx, dr, dw = torch.autograd.grad((normed, total), (x64, r64, w64), (d_normed.double(), d_resid.double()))
    s_x, s_w = _norm_slacks(v.detach(), w64.detach(), d_normed.double(), dim)
    s_x = s_x + U32 * d_resid.double().abs()  # one more fp32 add: dv + d_residual
    assert torch.equal(dx, dr)  # the spec: both inputs of the add get the same gradient
    assert_close_to_oracle(x.grad, dx, s_x, f"{name} {lp} add_rms_norm dx")
    assert_close_to_oracle(r.grad, dr, s_x, f"{name} {lp} add_rms_norm dr")
    assert_close_to_oracle(w.grad, dw, s_w, f"{name} {lp} add_rms_norm dw")


# ------------------------------------------------------------------------ the check is sharp


@pytest.mark.parametrize("lp", LP, ids=str)
def test_oracle_rejects_small_bias(lp):
    """The check above fails a gradient biased by 2^-11 relative, and passes the unbiased one.

    Stands for the mutations it must catch: a 2^-11 bias in SwiGLU's gate gradient, RoPE's
    backward with unrounded cos/sin (a 2^-9 relative change of each term).
    """
    g = torch.Generator().manual_seed(16)
    exact = torch.randn(20000, generator=g, dtype=torch.float64)
    slack = 16 * U32 * exact.abs()
    assert violations(exact.to(lp), exact, slack) == 0
    biased = (exact * (1 + 2.0**-11)).to(lp)
    n = violations(biased, exact, slack)
    # about 1 in 16 elements crosses a rounding midpoint in bf16 (2^-11 / 2^-7), more in fp16
    assert n > 0.02 * exact.numel(), n
