"""The ops the newer families need: ``rla.ops.geglu`` (Gemma's gelu-tanh gated product) and the
zero-centred norm (``weight_offset=1.0``: x * rstd * (1 + w)), forward against HF's own modules
and the spec written out, backward against fp64 autograd of an independent expression.

The backward check is the one of tests/ops/test_backward_oracle.py: |g - e| <= ulp(e)/2 + slack,
the slack a few fp32 ulps of the magnitudes of the terms (the op's fp32 arithmetic before its one
final rounding), written here again so that this file stands alone.
"""

import dataclasses

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

import rla.ops as ops
from rla import profiles

from profile_rows import DISTINCT  # noqa: E402

PROFILES = DISTINCT  # each way of rounding once (tests/profile_rows.py)
BF16 = torch.bfloat16
U32 = 2.0**-24


def _check(got, exact, slack, what):
    assert exact.abs().max() > 0, f"{what}: the oracle is zero; nothing is checked"
    _, e = torch.frexp(exact)
    ulp = torch.ldexp(torch.ones_like(exact), e - 8).clamp_min(2.0**-133)
    bad = int(((got.double() - exact).abs() > 0.5 * ulp + slack).sum())
    assert bad == 0, f"{what}: {bad} of {got.numel()} elements beyond half an ulp of the fp64 gradient"


def _inputs(shape, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * s).to(BF16) for s in (scale, 1.0, 1.0)]


# ------------------------------------------------------------------------------------------ GeGLU


@pytest.mark.parametrize("name", PROFILES)
def test_geglu_forward_is_the_point(name):
    gate, up, _ = _inputs((5, 33, 96), 1)
    got = ops.geglu(gate, up, name)
    if profiles.get(name).swiglu == "per_op":  # HF's Gemma3MLP: act_fn(gate) * up on bf16 tensors
        want = ACT2FN["gelu_pytorch_tanh"](gate) * up
    else:
        want = (torch.nn.functional.gelu(gate.float(), approximate="tanh") * up.float()).to(BF16)
    assert torch.equal(got, want)


def test_geglu_points_differ():
    gate, up, _ = _inputs((5, 33, 96), 2)
    assert not torch.equal(ops.geglu(gate, up, "hf"), ops.geglu(gate, up, "vllm"))


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_geglu_backward_oracle(name):
    gate, up, dy = _inputs((4, 37, 64), 3)
    gate.requires_grad_(True)
    up.requires_grad_(True)
    ops.geglu(gate, up, name).backward(dy)
    g64 = gate.detach().double().requires_grad_(True)
    u64 = up.detach().double().requires_grad_(True)
    beta = (2.0 / torch.pi) ** 0.5
    out = 0.5 * g64 * (1.0 + torch.tanh(beta * (g64 + 0.044715 * g64**3))) * u64  # the tanh gelu written out
    dgate, dup = torch.autograd.grad(out, (g64, u64), dy.double())
    gd, mag = gate.detach().double(), (dy.double() * up.detach().double()).abs()
    # fp32: tanh (a few ulps) and ~12 products/adds, relative to the magnitudes of the terms
    mag_gate = mag * (1.0 + gd.abs() * (1.0 + 3 * 0.044715 * gd * gd))
    _check(gate.grad, dgate, 64 * U32 * mag_gate, f"{name} geglu dgate")
    _check(up.grad, dup, 32 * U32 * (dy.double() * gd).abs(), f"{name} geglu dup")


# ---------------------------------------------------------------------------- zero-centred norm


def test_zero_centred_norm_fused_is_hf_gemma3_rmsnorm():
    x, _, _ = _inputs((3, 17, 128), 4, scale=2.0)
    norm = Gemma3RMSNorm(128, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(0.3 * torch.randn(128, generator=torch.Generator().manual_seed(5)))
    norm = norm.to(BF16)
    fused = profiles.get("hf").variant("zero_centred_norm")
    assert fused.norm_weight == "fused"
    with torch.no_grad():
        assert torch.equal(ops.rms_norm(x, norm.weight, 1e-6, fused, weight_offset=1.0), norm(x))
        per_op = ops.rms_norm(x, norm.weight, 1e-6, "hf", weight_offset=1.0)
        v = x.float()
        n = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
        assert torch.equal(per_op, ((1.0 + norm.weight.float()) * n.to(BF16).float()).to(BF16))
        assert not torch.equal(per_op, norm(x))


def test_zero_centred_norm_master_weight_is_the_engines_copy():
    """An fp32 master weight: the engine holds RN(w) and forms 1 + RN(w), not 1 + w."""
    x, _, _ = _inputs((4, 64), 6)
    w = 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(7))
    got = ops.rms_norm(x, w, 1e-6, "vllm", weight_offset=1.0)
    assert torch.equal(got, ops.rms_norm(x, w.to(BF16), 1e-6, "vllm", weight_offset=1.0))


def test_weight_offset_is_checked():
    x, _, _ = _inputs((2, 8), 8)
    with pytest.raises(ValueError, match="weight_offset must be 0.0"):
        ops.rms_norm(x, torch.zeros(8, dtype=BF16), 1e-6, "hf", weight_offset=0.5)


@pytest.mark.parametrize("name", ["hf", "vllm"])
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add_norm"])
def test_zero_centred_norm_backward_oracle(name, add):
    dim, eps = 96, 1e-6
    x, r, dy = _inputs((3, 21, dim), 9, scale=2.0)
    w = (0.3 * torch.randn(dim, generator=torch.Generator().manual_seed(10))).to(BF16)
    for t in (x, r, w):
        t.requires_grad_(True)
    if add:
        normed, rounded = ops.add_rms_norm(x, r, w, eps, name, weight_offset=1.0)
        normed.backward(dy)
    else:
        ops.rms_norm(x, w, eps, name, weight_offset=1.0).backward(dy)
    x64, r64, w64 = (t.detach().double().requires_grad_(True) for t in (x, r, w))
    v = x64 + r64 if add else x64
    if add and profiles.get(name).norm_residual == "rounded_sum":
        v = x64 + (v.detach().to(BF16).double() - x64.detach())  # reads RN(x + r); the rounding straight-through
    rstd = 1.0 / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)
    out = v * rstd * (1.0 + w64)
    dx, dw = torch.autograd.grad(out, (x64, w64), dy.double())
    vd = v.detach()
    n = vd / torch.sqrt((vd * vd).mean(-1, keepdim=True))
    dyw = (dy.double() * (1.0 + w64.detach())).abs()
    mag_v = (1.0 / torch.sqrt((vd * vd).mean(-1, keepdim=True))) * (dyw + n.abs() * (dyw * n.abs()).mean(-1, keepdim=True))
    mag_w = (dy.double() * n).abs().reshape(-1, dim).sum(0)
    _check(x.grad, dx, 2 * (dim + 8) * U32 * mag_v, f"{name} zero-centred dx")
    _check(w.grad, dw, (x.numel() // dim + 4) * U32 * mag_w, f"{name} zero-centred dw")
    if add:
        assert torch.equal(r.grad, x.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_family_ops_on_cuda_are_the_reference():
    """On CUDA the zero-centred norm runs the reference (no fused kernel takes the offset yet), the
    gelu and the clamped SwiGLU rla's fused kernels (bitwise to the CUDA reference:
    tests/ops/test_gated_triton.py). Each equals the CPU reference except where CUDA's tanh / exp /
    the row mean's order differ from the CPU's in the last fp32 bit, which moves a bf16 output by
    at most one ulp."""
    x, r, _ = _inputs((64, 256), 11)
    w = (0.3 * torch.randn(256, generator=torch.Generator().manual_seed(12))).to(BF16)

    def close(got, want, what):
        got, want = got.cpu().float(), want.float()
        ulp = torch.ldexp(torch.ones_like(want), torch.frexp(want)[1] - 8)
        assert ((got - want).abs() <= ulp).all(), what
        assert (got == want).float().mean() > 0.99, what

    for name in ("hf", "vllm", "sglang"):
        close(ops.geglu(x.cuda(), r.cuda(), name), ops.geglu(x, r, name), f"{name} geglu")
        close(ops.swiglu_oai(x.cuda(), r.cuda(), 1.702, 7.0, name), ops.swiglu_oai(x, r, 1.702, 7.0, name),
              f"{name} swiglu_oai")
        got = ops.add_rms_norm(x.cuda(), r.cuda(), w.cuda(), 1e-6, name, weight_offset=1.0)
        want = ops.add_rms_norm(x, r, w, 1e-6, name, weight_offset=1.0)
        assert torch.equal(got[1].cpu(), want[1])
        close(got[0], want[0], f"{name} zero-centred add + norm")


# ------------------------------------------------------------------------- GPT-OSS clamped SwiGLU


def _oai_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(6, 33, 2 * 48, generator=g) * 5).to(BF16)  # |x| > 7 often: both clamps act
    return gate_up, torch.randn(6, 33, 48, generator=g).to(BF16)


@pytest.mark.parametrize("name", PROFILES)
def test_swiglu_oai_forward_is_the_point(name):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(GptOssConfig(hidden_size=32, intermediate_size=48, num_local_experts=2))
    gate_up, _ = _oai_inputs(20)
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    row = profiles.get(name).variant("gpt_oss")  # what rla.align hands GPT-OSS's experts
    got = ops.swiglu_oai(gate, up, experts.alpha, experts.limit, row)
    g, u = gate.float().clamp(max=7.0), up.float().clamp(-7.0, 7.0)
    if row.swiglu == "per_op":  # HF's own _apply_gate, op by op on bf16 tensors
        assert torch.equal(got, experts._apply_gate(gate_up))
    elif row.oai_glu == "quotient":  # the product, then one division (vLLM's kernel's SASS)
        assert torch.equal(got, ((g * (u + 1.0)) / (1.0 + torch.exp(-(g * 1.702)))).to(BF16))
    else:
        assert torch.equal(got, ((u + 1.0) * (g * torch.sigmoid(g * 1.702))).to(BF16))
    if row.swiglu == "fused":
        assert not torch.equal(got, experts._apply_gate(gate_up))


def test_swiglu_oai_orders_differ_in_fp32():
    """The two fp32 orders of ``oai_glu`` are different functions (fp32 tensors: the store rounds
    nothing, so the chain's own roundings show), and each is its expression."""
    gate_up, _ = _oai_inputs(22)
    gate, up = gate_up[..., ::2].float(), gate_up[..., 1::2].float()
    base = profiles.get("vllm-0.33-eager").variant("gpt_oss")
    assert base.oai_glu == "quotient" and base.swiglu == "fused"
    other = dataclasses.replace(base, oai_glu="sigmoid")
    q, s = (ops.swiglu_oai(gate, up, 1.702, 7.0, r) for r in (base, other))
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    assert torch.equal(q, (g * (u + 1.0)) / (1.0 + torch.exp(-(g * 1.702))))
    assert torch.equal(s, (u + 1.0) * (g * torch.sigmoid(g * 1.702)))
    assert not torch.equal(q, s)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_swiglu_oai_backward_oracle(name):
    gate_up, dy = _oai_inputs(21)
    gate = gate_up[..., ::2].contiguous().requires_grad_(True)
    up = gate_up[..., 1::2].contiguous().requires_grad_(True)
    ops.swiglu_oai(gate, up, 1.702, 7.0, name).backward(dy)
    g64 = gate.detach().double().requires_grad_(True)
    u64 = up.detach().double().requires_grad_(True)
    gc, uc = torch.clamp(g64, max=7.0), torch.clamp(u64, -7.0, 7.0)
    out = (uc + 1.0) * gc / (1.0 + torch.exp(-1.702 * gc))  # written another way than the op
    dgate, dup = torch.autograd.grad(out, (g64, u64), dy.double())
    gd, ud = gc.detach(), uc.detach()
    mag = (dy.double() * (ud.abs() + 1.0)).abs() * (1.0 + 1.702 * gd.abs())
    _check(gate.grad, dgate, 32 * U32 * mag, f"{name} swiglu_oai dgate")
    _check(up.grad, dup, 16 * U32 * (dy.double() * gd).abs(), f"{name} swiglu_oai dup")
    assert (gate.grad[gate.detach() > 7.0] == 0).all() and (up.grad[up.detach().abs() > 7.0] == 0).all()
