"""Inputs on which a one-ulp change of an op's fp32 arithmetic flips outputs.

Random moderate inputs hide one-ulp changes: on them ``1/sqrt`` and ``rsqrt`` agree in >99% of
rows (0.6% differ on the 2026-12 CI CPU), and ``(x + r) + m`` equals ``x + (r + m)`` exactly
whenever both partial sums are exact in fp32, which bf16 inputs of similar size always are. So
each test here builds its inputs to hit the differing cases (rows whose mean square is where the
two reciprocal square roots differ, measured on this machine at run time; residual streams with
large activations that cancel), asserts the op equals the spec's expression bit for bit, and then
asserts the input is *sensitive*: the planted change, applied to the spec's expression, flips
outputs on this very input. A change that no output can see would make the first assertion
vacuous; the second says it is not.
"""

from __future__ import annotations

import pytest
import torch

from rla import ops

from align_spec import spec_norm

EPS = 1e-6
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def _differing_rows(n: int, width: int, seed: int = 0):
    """``n`` bf16 rows whose fp32 mean square ``ms`` has rsqrt(ms + eps) != 1 / sqrt(ms + eps)
    here (searched in a pool of random rows), then ``n`` ordinary rows."""
    g = torch.Generator().manual_seed(seed)
    pool = (torch.randn(200_000, width, generator=g) * 4).to(torch.bfloat16)
    v = pool.float()
    ms = (v * v).mean(-1, keepdim=True) + EPS
    differ = (torch.rsqrt(ms) != 1 / torch.sqrt(ms)).squeeze(-1)
    if int(differ.sum()) < n:
        pytest.skip(f"this CPU's rsqrt equals 1/sqrt on all but {int(differ.sum())} of 200000 rows")
    return torch.cat([pool[differ][:n], pool[~differ][:n]])


def test_norm_rstd_one_ulp_is_seen():
    """The norm's fp32 output (what RoPE reads under qk_norm_out='fp32') shows the rstd bit for
    bit: ``1/sqrt`` for ``rsqrt``, or any one-ulp change of rstd, flips it. (In a bf16 output a
    one-ulp rstd change flips an element only near a rounding tie, about 1 in 30000, so the fp32
    output is where the norm's arithmetic is checked to the bit.)"""
    x = _differing_rows(256, 64)
    w = (1 + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    got = ops.rms_norm(x, w, EPS, "vllm-0.33", out_dtype=torch.float32)
    want = spec_norm(x.float(), w, EPS, {"norm_weight": "fused"}, torch.bfloat16, out=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(ops.rms_norm(x, w, EPS, "vllm-0.33"), want.to(torch.bfloat16))
    # sensitivity: the planted change flips outputs in every row it touches, and only there
    v = x.float()
    ms = (v * v).mean(-1, keepdim=True) + EPS
    planted = (v * (1 / torch.sqrt(ms))) * w.float()
    changed_rows = (planted != want).any(-1)
    assert changed_rows[:256].all() and not changed_rows[256:].any()
    up = (v * torch.nextafter(torch.rsqrt(ms), torch.full_like(ms, 2.0))) * w.float()
    assert (up != want).any(-1).all()  # one ulp up of rstd: seen in every row


def _cancelling_stream(n: int = 1 << 16, seed: int = 0):
    """A residual stream with large activations that the MLP output cancels (x ~ 1e3, m ~ -x, a
    small residual): both partial sums are inexact in fp32, in different ways."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g) * 1024).to(torch.bfloat16)
    m = (-x.float() + torch.randn(n, generator=g) * 4).to(torch.bfloat16)
    r = (torch.randn(n, generator=g) * 1e-3).to(torch.bfloat16)
    return x.view(16, -1), r.view(16, -1), m.view(16, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_carry_add_order_is_seen(device, out):
    x, r, m = (t.to(device) for t in _cancelling_stream())
    got = ops.carry_add(x, r, m, out)
    want = ((x.float() + r.float()) + m.float()).to(out)
    assert torch.equal(got, want)
    for planted in (x.float() + (r.float() + m.float()), (x.float() + m.float()) + r.float()):
        assert int((planted.to(out) != want).sum()) > (100 if out == torch.float32 else 10)
    # why the inputs are built so: on ordinary activations the orders agree bit for bit
    g = torch.Generator().manual_seed(1)
    a, b, c = ((torch.randn(1 << 16, generator=g) * 4).to(torch.bfloat16).float() for _ in range(3))
    assert torch.equal((a + b) + c, a + (b + c))
