"""rla.ops against the spec (bit for bit), against HF's own code, and on errors."""

import math

import pytest
import torch

import rla.ops as ops
from rla import profiles

import spec
from saved_memory import saved_bytes

from profile_rows import DISTINCT  # noqa: E402

PROFILES = DISTINCT  # each way of rounding once (tests/profile_rows.py)
DTYPES = [torch.bfloat16, torch.float16]


def rope_tables(batch, seq, dim, theta=1e6, offset=0):
    """fp32 cos/sin as HF's rotary module computes them, [B, S, D]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    pos = torch.arange(offset, offset + seq, dtype=torch.float32)[None, :].expand(batch, seq)
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


# (q shape, kv heads, unsqueeze_dim): [B, H, S, D] with dim 1, or [B, S, H, D] with dim 2
ROPE_SHAPES = [
    ((3, 423, 7, 92), 1, 2),
    ((2, 4, 33, 64), 2, 1),
    ((1, 6, 17, 128), 2, 1),
    ((2, 2, 9, 256), 1, 1),
]


def make_rope_inputs(shape, kv_heads, unsqueeze_dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape, generator=g).to(dtype)
    kshape = list(shape)
    kshape[1 if unsqueeze_dim == 1 else 2] = kv_heads
    k = torch.randn(kshape, generator=g).to(dtype)
    b, s, d = shape[0], shape[2] if unsqueeze_dim == 1 else shape[1], shape[-1]
    cos, sin = rope_tables(b, s, d, offset=1000)
    return q, k, cos, sin


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,kv,ud", ROPE_SHAPES, ids=lambda v: str(v))
def test_rope_matches_spec(name, dtype, shape, kv, ud):
    prof = profiles.get(name)
    q, k, cos, sin = make_rope_inputs(shape, kv, ud, dtype)
    qo, ko = ops.rope(q, k, cos, sin, name, unsqueeze_dim=ud)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    assert torch.equal(qo, spec.rope(q, cos, sin, prof, ud))
    assert torch.equal(ko, spec.rope(k, cos, sin, prof, ud))


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("shape,kv,ud", ROPE_SHAPES[:2], ids=lambda v: str(v))
def test_rope_half_tables(name, shape, kv, ud):
    """A half table [..., D/2] (fp32, or already rounded to q's dtype where the profile rounds
    cos/sin) gives the full table's outputs and gradients, bit for bit, against the spec."""
    prof, lp = profiles.get(name), torch.bfloat16
    q, k, cos, sin = make_rope_inputs(shape, kv, ud, lp, seed=3)
    half = shape[-1] // 2
    tables = [(cos[..., :half], sin[..., :half])]
    if prof.rope_cos_sin == "round":
        tables.append((cos[..., :half].to(lp), sin[..., :half].to(lp)))
    g = torch.Generator().manual_seed(4)
    ups = [torch.randn(t.shape, generator=g).to(lp) for t in (q, k)]

    def run(c, s):
        ql, kl = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        outs = ops.rope(ql, kl, c, s, name, unsqueeze_dim=ud)
        torch.autograd.backward(outs, ups)
        return [*outs, ql.grad, kl.grad]

    full = run(cos, sin)
    assert torch.equal(full[0], spec.rope(q, cos, sin, prof, ud))
    for c, s in tables:
        got = run(c, s)
        for what, a, b in zip(("q", "k", "dq", "dk"), got, full):
            assert torch.equal(a, b), f"{name} {c.dtype} half table: {what} differs"


SWIGLU_SHAPES = [(3, 423, 7, 92), (5, 1000), (2, 33, 256)]


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SWIGLU_SHAPES, ids=str)
def test_swiglu_matches_spec(name, dtype, shape):
    g = torch.Generator().manual_seed(1)
    gate = (torch.randn(shape, generator=g) * 3).to(dtype)
    up = torch.randn(shape, generator=g).to(dtype)
    out = ops.swiglu(gate, up, name)
    assert out.dtype == dtype
    assert torch.equal(out, spec.swiglu(gate, up, profiles.get(name)))


NORM_SHAPES = [(3, 423, 92), (4, 64), (2, 9, 128), (1, 5, 256), (7, 896)]


def norm_inputs(shape, dtype, weight_dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    r = (torch.randn(shape, generator=g) * 20).to(dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(weight_dtype)
    return x, r, w


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("master", [False, True], ids=["lp-weight", "fp32-weight"])
def test_norms_match_spec(name, dtype, shape, master):
    prof = profiles.get(name)
    x, r, w = norm_inputs(shape, dtype, torch.float32 if master else dtype)
    out = ops.rms_norm(x, w, 1e-6, name)
    assert out.dtype == dtype
    assert torch.equal(out, spec.rms_norm(x, w, 1e-6, prof))
    normed, new_res = ops.add_rms_norm(x, r, w, 1e-6, name)
    ref_normed, ref_res = spec.add_rms_norm(x, r, w, 1e-6, prof)
    assert torch.equal(new_res, ref_res)
    assert torch.equal(normed, ref_normed)


@pytest.mark.parametrize("name", PROFILES)
def test_rms_norm_of_fp32_sum_equals_add_rms_norm(name):
    """rms_norm(x + r in fp32, dtype=bf16) is how a norm reads the sum across a layer boundary."""
    x, r, w = norm_inputs((4, 33, 96), torch.bfloat16, torch.bfloat16)
    normed, _ = ops.add_rms_norm(x, r, w, 1e-6, name)
    prof = profiles.get(name)
    v = x.float() + r.float() if prof.norm_residual == "fp32_sum" else (x + r).float()
    assert torch.equal(ops.rms_norm(v, w, 1e-6, name, dtype=torch.bfloat16), normed)


# ---------------------------------------------------------------- hf == transformers' own code


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hf_profile_equals_transformers(dtype):
    from transformers.activations import ACT2FN
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, apply_rotary_pos_emb

    q, k, cos, sin = make_rope_inputs((2, 4, 57, 128), 2, 1, dtype, seed=3)
    want = apply_rotary_pos_emb(q, k, cos.to(dtype), sin.to(dtype))  # HF's rotary returns lp cos/sin
    got = ops.rope(q, k, cos, sin, "hf")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    g = torch.Generator().manual_seed(5)
    gate = (torch.randn(3, 50, 344, generator=g) * 3).to(dtype)
    up = torch.randn(3, 50, 344, generator=g).to(dtype)
    assert torch.equal(ops.swiglu(gate, up, "hf"), ACT2FN["silu"](gate) * up)

    x, r, w = norm_inputs((3, 50, 896), dtype, dtype)
    norm = Qwen2RMSNorm(896, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    assert torch.equal(ops.rms_norm(x, w, 1e-6, "hf"), norm(x))
    normed, new_res = ops.add_rms_norm(x, r, w, 1e-6, "hf")
    hf_sum = r + x  # HF's decoder layer: hidden_states = residual + hidden_states
    assert torch.equal(new_res, hf_sum)
    assert torch.equal(normed, norm(hf_sum))


# ---------------------------------------------------------------- rounding location matters


def _all_regions(name, dtype, seed=4):
    q, k, cos, sin = make_rope_inputs((2, 8, 256, 128), 2, 1, dtype, seed)
    g = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(512, 1024, generator=g).to(dtype), torch.randn(512, 1024, generator=g).to(dtype)
    x, r, w = norm_inputs((512, 1024), dtype, dtype, seed)
    return {
        "rope": ops.rope(q, k, cos, sin, name)[0],
        "swiglu": ops.swiglu(gate, up, name),
        "rmsnorm": ops.rms_norm(x, w, 1e-6, name),
        "add_rmsnorm": ops.add_rms_norm(x, r, w, 1e-6, name)[0],
    }


def test_rounding_location_matters_in_bf16_and_not_in_fp32():
    hf, vllm = _all_regions("hf", torch.bfloat16), _all_regions("vllm", torch.bfloat16)
    for region in hf:
        frac = (hf[region] != vllm[region]).float().mean().item()
        assert frac > 0.10, f"{region}: hf and vllm differ in only {frac:.1%} of elements"
    hf32, vllm32 = _all_regions("hf", torch.float32), _all_regions("vllm", torch.float32)
    for region in hf32:
        assert torch.equal(hf32[region], vllm32[region]), region


def test_fp32_inputs_are_not_rounded():
    q, k, cos, sin = make_rope_inputs((1, 2, 16, 64), 2, 1, torch.float32)
    out = ops.rope(q, k, cos, sin, "vllm")[0]
    a = q.double() * cos[:, None].double()
    b = spec.rotate_half(q.double()) * sin[:, None].double()
    # fp32 products and sum, no lower rounding: |error| <= 2 u (|a| + |b|) with u = 2^-24
    assert ((out.double() - (a + b)).abs() <= 2 * 2**-24 * (a.abs() + b.abs())).all()
    assert out.dtype == torch.float32
    # while a bf16 rounding anywhere would break that bound by orders of magnitude
    bf = ops.rope(q.bfloat16(), k.bfloat16(), cos, sin, "vllm")[0].double()
    assert not ((bf - (a + b)).abs() <= 2 * 2**-24 * (a.abs() + b.abs())).all()


# ---------------------------------------------------------------- gradients vs fp64


def _grad_errors(fn, inputs, oracle_fn):
    """Max and mean abs error of fn's input gradients against the fp64 oracle's, same upstream."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(7)
    ups = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, ups)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_out = oracle_fn(*ref_leaves)
    ref_outs = ref_out if isinstance(ref_out, tuple) else (ref_out,)
    torch.autograd.backward(ref_outs, [u.double() for u in ups])
    errs = []
    for leaf, ref in zip(leaves, ref_leaves):
        assert torch.isfinite(leaf.grad).all()
        d = (leaf.grad.double() - ref.grad).abs()
        errs.append((d.max().item(), d.mean().item()))
    return errs


def _oracles(prof, lp):
    """fp64 versions of each region's math under prof (its constants, no intermediate rounding)."""

    def rope(q, k, cos, sin):
        if prof.rope_cos_sin == "round":
            cos, sin = cos.to(lp).double(), sin.to(lp).double()
        c, s = cos[:, None], sin[:, None]
        return q * c + spec.rotate_half(q) * s, k * c + spec.rotate_half(k) * s

    def swiglu(g, u):
        return torch.nn.functional.silu(g) * u

    def norm(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    def add_norm(x, r, w):
        return norm(x + r, w), x + r

    return {"rope": rope, "swiglu": swiglu, "rmsnorm": norm, "add_rmsnorm": add_norm}


def _hf_eager():
    from transformers.activations import ACT2FN
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    def hf_norm(x, w):
        v = x.to(torch.float32)
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * v.to(x.dtype)

    return {
        "rope": lambda q, k, cos, sin: apply_rotary_pos_emb(q, k, cos.to(q.dtype), sin.to(q.dtype)),
        "swiglu": lambda g, u: ACT2FN["silu"](g) * u,
        "rmsnorm": hf_norm,
        "add_rmsnorm": lambda x, r, w: (hf_norm(r + x, w), r + x),
    }


@pytest.mark.parametrize("name", PROFILES)
def test_gradients_no_worse_than_hf_eager(name):
    prof, lp = profiles.get(name), torch.bfloat16
    oracle = _oracles(prof, lp)
    hf = _hf_eager()
    ours = {
        "rope": lambda q, k, c, s: ops.rope(q, k, c, s, name),
        "swiglu": lambda g, u: ops.swiglu(g, u, name),
        "rmsnorm": lambda x, w: ops.rms_norm(x, w, 1e-6, name),
        "add_rmsnorm": lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-6, name),
    }
    for seed in range(3):
        q, k, cos, sin = make_rope_inputs((2, 4, 64, 128), 2, 1, lp, seed)
        x, r, w = norm_inputs((64, 512), lp, lp, seed)
        g = torch.Generator().manual_seed(seed)
        gate, up = (torch.randn(64, 512, generator=g) * 3).to(lp), torch.randn(64, 512, generator=g).to(lp)
        cases = {
            "rope": ((q, k), (cos, sin)),
            "swiglu": ((gate, up), ()),
            "rmsnorm": ((x, w), ()),
            "add_rmsnorm": ((x, r, w), ()),
        }
        for region, (diff, const) in cases.items():
            n = len(diff)

            def wrap(f, n=n, const=const):
                return lambda *a: f(*a[:n], *const)

            def wrap_oracle(f, n=n, const=const):
                return lambda *a: f(*a[:n], *[c.double() for c in const])

            mine = _grad_errors(wrap(ours[region]), diff, wrap_oracle(oracle[region]))
            theirs = _grad_errors(wrap(hf[region]), diff, wrap_oracle(oracle[region]))
            for i, ((m_max, m_mean), (h_max, h_mean)) in enumerate(zip(mine, theirs)):
                assert m_mean <= h_mean, f"{region} input {i} seed {seed}: mean {m_mean} > HF {h_mean}"
                assert m_max <= h_max, f"{region} input {i} seed {seed}: max {m_max} > HF {h_max}"


# ---------------------------------------------------------------- saved memory for backward


@pytest.mark.parametrize("name", PROFILES)
def test_saved_memory_not_above_hf_eager(name):
    lp = torch.bfloat16
    hf = _hf_eager()
    q, k, cos, sin = make_rope_inputs((2, 4, 64, 128), 2, 1, lp)
    q.requires_grad_(True), k.requires_grad_(True)
    cos_lp, sin_lp = cos.to(lp), sin.to(lp)  # HF's rotary module hands bf16 cos/sin to every layer
    x, r, w = norm_inputs((64, 512), lp, lp)
    g = torch.Generator().manual_seed(6)
    gate, up = torch.randn(64, 512, generator=g).to(lp), torch.randn(64, 512, generator=g).to(lp)
    for t in (x, r, w, gate, up):
        t.requires_grad_(True)
    pairs = {
        "rope": (saved_bytes(lambda *a: ops.rope(*a, name), (q, k, cos, sin)),
                 saved_bytes(lambda *a: hf["rope"](*a), (q, k, cos_lp, sin_lp))),
        "swiglu": (saved_bytes(lambda *a: ops.swiglu(*a, name), (gate, up)),
                   saved_bytes(hf["swiglu"], (gate, up))),
        "rmsnorm": (saved_bytes(lambda *a: ops.rms_norm(*a, 1e-6, name), (x, w)),
                    saved_bytes(hf["rmsnorm"], (x, w))),
        "add_rmsnorm": (saved_bytes(lambda *a: ops.add_rms_norm(*a, 1e-6, name), (x, r, w)),
                        saved_bytes(hf["add_rmsnorm"], (x, r, w))),
    }
    for region, (mine, theirs) in pairs.items():
        print(f"{name:>10} {region:>12}: rla {mine:>8} B   HF eager {theirs:>8} B")
        assert mine <= theirs, f"{region}: rla keeps {mine} B for backward, HF eager {theirs} B"
    # The comparison is not vacuous: HF keeps the silu output and fp32 copies in the norms.
    assert pairs["swiglu"][1] > 0 and pairs["rmsnorm"][1] > 0 and pairs["add_rmsnorm"][1] > 0


# ---------------------------------------------------------------- errors


def test_clear_errors():
    q, k, cos, sin = make_rope_inputs((1, 2, 8, 64), 2, 1, torch.bfloat16)
    with pytest.raises(KeyError, match="known profiles: hf, sglang-0.5.23, vllm-0.26, vllm-0.26-eager, vllm-0.33"):
        ops.rope(q, k, cos, sin, "vlm")
    with pytest.raises(TypeError, match="profile must be"):
        ops.swiglu(q, q, 3)
    with pytest.raises(ValueError, match="even head dim"):
        ops.rope(q[..., :63], k[..., :63], cos[..., :63], sin[..., :63], "vllm")
    with pytest.raises(ValueError, match="shapes disagree"):
        ops.rope(q, k[..., :32], cos, sin, "vllm")
    with pytest.raises(ValueError, match=r"(?s)D \(HF's table\) or D/2.*cos \(1, 8, 16\)"):
        ops.rope(q, k, cos[..., :16], sin[..., :16], "vllm")
    with pytest.raises(ValueError, match="shapes disagree"):
        ops.rope(q, k, cos[..., :32], sin, "vllm")
    with pytest.raises(ValueError, match="do not broadcast"):
        ops.rope(q, k, cos[:, :5], sin[:, :5], "vllm")
    with pytest.raises(TypeError, match="keeps cos/sin in fp32"):
        ops.rope(q, k, cos.bfloat16(), sin.bfloat16(), "sglang")
    with pytest.raises(TypeError, match="int64"):
        ops.swiglu(torch.ones(3, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), "vllm")
    with pytest.raises(ValueError, match="same shape"):
        ops.swiglu(torch.ones(3, 4), torch.ones(3, 5), "vllm")
    with pytest.raises(TypeError, match="one dtype"):
        ops.swiglu(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.bfloat16), "vllm")
    with pytest.raises(ValueError, match="last dim"):
        ops.rms_norm(torch.ones(3, 4), torch.ones(5), 1e-6, "vllm")
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm(torch.ones(3, 4), torch.ones(4), math.nan, "vllm")
    with pytest.raises(ValueError, match="same shape"):
        ops.add_rms_norm(torch.ones(3, 4), torch.ones(2, 4), torch.ones(4), 1e-6, "vllm")
    with pytest.raises(TypeError, match="fp32 master"):
        ops.rms_norm(torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.float16), 1e-6, "hf")


def test_launch_grid_helpers():
    """The launchers' host-int helpers against their definitions (and Triton's own, which cost
    ~6 us of host time per call since Triton 3.5)."""
    triton = pytest.importorskip("triton")
    from rla.ops._triton_common import cdiv, next_pow2

    for n in [*range(1, 2100), 2**20 - 1, 2**20, 2**20 + 1, 16384 * 28]:
        p = next_pow2(n)
        assert p >= n and (p == 1 or p // 2 < n) and p & (p - 1) == 0
        assert p == triton.next_power_of_2(n)
        for d in (1, 2, 3, 4, 128, 1000):
            assert cdiv(n, d) == math.ceil(n / d) == triton.cdiv(n, d)
    assert cdiv(0, 7) == 0
