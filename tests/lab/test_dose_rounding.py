"""``lab.dose.mantissa.round_mantissa`` and the dose (``lab.dose.knob``) against independent oracles.

The op works on fp32 bit patterns (add half a quantum, clear the dropped bits). The oracles here
never touch bits: an fp64 one (every step exact in fp64: ``|x| / q`` with ``q`` a power of two,
``np.rint``'s round-half-to-even) run over every bf16 number and a million random fp32 patterns,
and a ``fractions.Fraction`` one (exact rational arithmetic, Python's ``round`` = ties to even)
over hand-picked ties, binade edges, subnormals and the overflow edge.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from lab.dose.mantissa import MAX_BITS, round_mantissa, round_mantissa_values
from lab.dose.knob import DoseOps, dose, dose_values


def oracle_fp64(x: np.ndarray, bits: int) -> np.ndarray:
    """RNE to ``bits`` mantissa bits with fp32's exponent range, in fp64 (exact for fp32 inputs)."""
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        x = np.asarray(x, dtype=np.float64)
    out = x.copy()  # NaN, inf and zeros pass through
    fin = np.isfinite(x) & (x != 0)
    a = np.abs(x[fin])
    _, e = np.frexp(a)  # a = m * 2^e, m in [0.5, 1): binade [2^(e-1), 2^e)
    q = np.ldexp(1.0, np.maximum(e - 1, -126) - bits)
    r = np.rint(a / q) * q  # a / q exact (power-of-two divide); rint ties to even
    r = np.where(r >= 2.0**128, np.inf, r)
    out[fin] = np.copysign(r, x[fin])
    return out


def oracle_fraction(v: float, bits: int) -> float:
    if math.isnan(v) or math.isinf(v) or v == 0:
        return v
    a = Fraction(abs(v))
    e = math.frexp(abs(v))[1] - 1
    q = Fraction(2) ** (max(e, -126) - bits)
    r = round(a / q) * q  # Fraction.__round__: half to even
    r = math.inf if r >= 2**128 else float(r)
    return math.copysign(r, v)


def f32(bits_pattern: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits_pattern & 0xFFFFFFFF))[0]


def same(a: torch.Tensor, b: np.ndarray) -> None:
    """Bitwise equal as fp32, NaN equal to NaN, -0 distinct from +0."""
    got = a.float().numpy().view(np.uint32)
    want = b.astype(np.float32).view(np.uint32)
    nan = np.isnan(b)
    bad = np.flatnonzero((got != want) & ~nan)
    assert not bad.size, (f"{bad.size} mismatches, first: x index {bad[0]} got {a.float().numpy()[bad[0]]!r} "
                          f"want {b[bad[0]]!r}")
    assert np.isnan(a.float().numpy()[nan]).all()


ALL_BF16 = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("bits", range(1, 8))
def test_every_bf16_number_matches_the_fp64_oracle(bits):
    got = round_mantissa_values(ALL_BF16, bits)
    assert got.dtype == torch.bfloat16
    same(got, oracle_fp64(ALL_BF16.float().numpy(), bits))


@pytest.mark.parametrize("bits", range(1, MAX_BITS + 1))
def test_random_fp32_patterns_match_the_fp64_oracle(bits):
    rng = np.random.default_rng(1000 + bits)
    pats = rng.integers(0, 2**32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    x = torch.from_numpy(pats.view(np.float32).copy())
    got = round_mantissa_values(x, bits)
    assert got.dtype == torch.float32
    same(got, oracle_fp64(x.numpy(), bits))


def _edge_values(bits: int) -> list[float]:
    """Ties, just-off ties, binade edges, subnormals, the overflow edge, specials."""
    vals = [0.0, -0.0, math.inf, -math.inf, 1.0, -1.0, f32(0x7F7FFFFF), -f32(0x7F7FFFFF), f32(1), f32(0x00800000)]
    shift = MAX_BITS - bits
    for base in (0x3F800000, 0x3FC00000, 0x00400000, 0x00012345 << 3, 0x7F000000, 0x7F7F0000, 0x0080_0000):
        keep = base & ~((1 << shift) - 1) if shift else base
        for lsb in (0, 1):  # kept LSB even / odd decides a tie
            k = keep | (lsb << shift) if shift < 32 else keep
            half = 1 << (shift - 1) if shift else 0
            for d in (half, half - 1, half + 1, 0, (1 << shift) - 1 if shift else 0):
                if d >= 0:
                    vals += [f32(k + d), -f32(k + d)]
    return [v for v in vals if not math.isnan(v)]


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 10, 16, 22, 23])
def test_ties_edges_and_specials_match_the_exact_rational_oracle(bits):
    vals = _edge_values(bits)
    x = torch.tensor(vals, dtype=torch.float32)
    got = round_mantissa_values(x, bits).tolist()
    want = [oracle_fraction(v, bits) for v in x.tolist()]
    for v, g, w in zip(x.tolist(), got, want):
        assert struct.pack("<f", g) == struct.pack("<f", w), (v.hex(), bits, g, w)


def test_hand_computed_ties_go_to_even():
    x = torch.tensor([1.25, 1.75, 2.5, 3.5, -1.25, 1.2500001], dtype=torch.float32)
    # 1 mantissa bit: the grid in [1, 2) is {1, 1.5}, in [2, 4) {2, 3}
    assert round_mantissa(x, 1).tolist() == [1.0, 2.0, 2.0, 4.0, -1.0, 1.5]
    # 2 bits: {1, 1.25, 1.5, 1.75, 2}; 1.125 ties to 1 (n = 4), 1.375 to 1.5 (n = 6), 1.875 to 2 (n = 8)
    assert round_mantissa(torch.tensor([1.125, 1.375, 1.875, -1.625]), 2).tolist() == [1.0, 1.5, 2.0, -1.5]


def test_overflow_rounds_to_inf_and_nan_passes_through():
    big = f32(0x7F7FFFFF)  # fp32 max: rounds up past the largest 4-bit number to inf
    x = torch.tensor([big, -big, math.nan, math.inf], dtype=torch.float32)
    out = round_mantissa(x, 4)
    assert out[0] == math.inf and out[1] == -math.inf and math.isnan(out[2]) and out[3] == math.inf
    nan_payload = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)  # would clear to inf
    assert math.isnan(round_mantissa(nan_payload, 3).item())


def test_seven_bits_is_bf16_and_native_precision_is_the_identity():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e3
    assert torch.equal(round_mantissa(x, 7), x.to(torch.bfloat16).float())
    xb = x.to(torch.bfloat16)
    assert round_mantissa(xb, 7) is xb and round_mantissa(x, 23) is x


def test_straight_through_gradient():
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).requires_grad_(True)
    g = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    round_mantissa(x, 3).backward(g)
    assert torch.equal(x.grad, g)
    x.grad = None
    dose(x, 3, 0.6).backward(g)
    assert torch.equal(x.grad, g)


def test_refuses_other_dtypes_and_bits():
    with pytest.raises(TypeError, match="bf16 or fp32"):
        round_mantissa(torch.ones(2, dtype=torch.float16), 3)
    for bad in (0, -1, 24, 2.0, True):
        with pytest.raises(ValueError, match="bits"):
            round_mantissa(torch.ones(2), bad)


@pytest.mark.parametrize("scale", [0.35, 0.5, 1.0, 1.7])
def test_dose_scale_is_the_scaled_rounding_error_stored_in_bf16(scale):
    x = torch.randn(8192, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    xd = x.double().numpy()
    want = torch.from_numpy(xd + scale * (oracle_fp64(xd, 3) - xd)).float().to(torch.bfloat16)
    got = dose_values(x, 3, scale)
    # fp32 then bf16 here vs fp64 then fp32 then bf16 in the oracle: both exact sums (a bf16 plus a
    # short multiple of its ulp fits fp32), so the one rounding is the same
    assert torch.equal(got, want)
    if scale == 1.0:
        assert torch.equal(got, round_mantissa(x, 3))
    err = (got.double() - x.double()).abs().mean() / (round_mantissa(x, 3).double() - x.double()).abs().mean()
    # the mean error is scale x the rounding's, up to the bf16 store of the scaled error
    assert abs(float(err) - scale) < 0.1 * scale


def test_dose_ops_round_every_region_output():
    from rla import ops

    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 4, 16, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    ang = torch.arange(16.0)[:, None] * torch.rand(4, generator=g)
    cos, sin = ang.cos()[None], ang.sin()[None]
    d = DoseOps(3)
    q0, k0 = ops.rope(q, k, cos, sin, "vllm")
    q1, k1 = d.rope(q, k, cos, sin, "vllm")
    assert torch.equal(q1, round_mantissa(q0, 3)) and torch.equal(k1, round_mantissa(k0, 3))
    assert not torch.equal(q1, q0)
    a, b = (torch.randn(5, 32, generator=g).to(torch.bfloat16) for _ in range(2))
    assert torch.equal(d.swiglu(a, b, "vllm"), round_mantissa(ops.swiglu(a, b, "vllm"), 3))
    w = torch.rand(32, generator=g).to(torch.bfloat16)
    assert torch.equal(d.rms_norm(a, w, 1e-6, "vllm"), round_mantissa(ops.rms_norm(a, w, 1e-6, "vllm"), 3))
    n0, r0 = ops.add_rms_norm(a, b, w, 1e-6, "vllm")
    n1, r1 = d.add_rms_norm(a, b, w, 1e-6, "vllm")
    assert torch.equal(n1, round_mantissa(n0, 3)) and torch.equal(r1, r0)  # the residual stream is left alone
    assert torch.equal(DoseOps(7).swiglu(a, b, "vllm"), ops.swiglu(a, b, "vllm"))  # 7 bits = bf16: nothing


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6])
def test_cuda_rounding_is_the_cpu_rounding(bits):
    """Every bf16 value rounds to the same bits on CUDA as on the CPU; NaN inputs stay NaN on both
    (their payload is not compared: CUDA's kernels return the canonical 0x7FFF NaN where the CPU
    keeps the input's, seen on the H200, torch 2.11)."""
    got = round_mantissa_values(ALL_BF16.cuda(), bits).cpu()
    want = round_mantissa_values(ALL_BF16, bits)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(bits)) * 10
    assert torch.equal(dose_values(x.cuda().bfloat16(), bits, 0.7).cpu(), dose_values(x.bfloat16(), bits, 0.7))


@pytest.mark.gpu
@CUDA
def test_cuda_dose_ops_round_the_fused_ops_outputs():
    from rla import ops

    g = torch.Generator(device="cuda").manual_seed(5)
    a, b = (torch.randn(64, 640, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    w = torch.rand(640, device="cuda", generator=g).to(torch.bfloat16)
    d = DoseOps(3, 0.7)
    assert torch.equal(d.swiglu(a, b, "vllm"), dose(ops.swiglu(a, b, "vllm"), 3, 0.7))
    n0, r0 = ops.add_rms_norm(a, b, w, 1e-6, "vllm")
    n1, r1 = d.add_rms_norm(a, b, w, 1e-6, "vllm")
    assert torch.equal(n1, dose(n0, 3, 0.7)) and torch.equal(r1, r0)
