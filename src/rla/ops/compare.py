"""Run every region under every profile on the same inputs and see where the outputs part.

This is what ``rla check-ops`` prints: the fraction of output elements that differ from the
``hf`` profile (the usual training stack) and each profile's error against an fp64 oracle of the
exact math on the same inputs. It makes the paper's point visible on random data: moving where a
region rounds changes a quarter of its bf16 outputs, and keeping fp32 until the store is closer
to exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import rla.ops as ops
from rla import profiles as _profiles

# Qwen2.5-1.5B: hidden 1536, MLP 8960, 12 query heads and 2 KV heads of dim 128, rope theta 1e6.
QWEN_SHAPES = dict(hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128, theta=1e6)

#: The ops compared: the three regions of ``rla.profiles.REGIONS``, the norm in both its forms.
OPS = (*_profiles.REGIONS, "add_rmsnorm")


@dataclass(frozen=True)
class RegionResult:
    profile: str
    region: str
    differs_from_hf: float
    """Fraction of output elements not bitwise equal to the ``hf`` profile's output."""
    max_abs_error: float
    """Max |output - fp64 oracle| over the region's (first) output."""
    mean_abs_error: float


def _inputs(tokens: int, dtype: torch.dtype, device: str, seed: int, position_offset: int):
    s = QWEN_SHAPES
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    d = s["head_dim"]
    inv_freq = 1.0 / (s["theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    pos = torch.arange(position_offset, position_offset + tokens, dtype=torch.float32)
    emb = torch.cat([pos[:, None] * inv_freq] * 2, dim=-1)[None]  # [1, S, D]
    return {
        "q": randn(1, s["heads"], tokens, d),
        "k": randn(1, s["kv_heads"], tokens, d),
        "cos": emb.cos().to(device),
        "sin": emb.sin().to(device),
        "gate": randn(tokens, s["intermediate"], scale=2.0),
        "up": randn(tokens, s["intermediate"]),
        "x": randn(tokens, s["hidden"], scale=2.0),
        "residual": randn(tokens, s["hidden"], scale=8.0),
        "weight": (1 + 0.2 * torch.randn(s["hidden"], generator=g)).to(device=device, dtype=dtype),
    }


def _run(region: str, t: dict, profile) -> torch.Tensor:
    if region == "rope":
        return ops.rope(t["q"], t["k"], t["cos"], t["sin"], profile)[0]
    if region == "swiglu":
        return ops.swiglu(t["gate"], t["up"], profile)
    if region == "rmsnorm":
        return ops.rms_norm(t["x"], t["weight"], 1e-6, profile)
    return ops.add_rms_norm(t["x"], t["residual"], t["weight"], 1e-6, profile)[0]


def _oracle(region: str, t: dict) -> torch.Tensor:
    d = {k: v.double() for k, v in t.items()}
    if region == "rope":
        q, c, s = d["q"], d["cos"][:, None], d["sin"][:, None]
        h = q.shape[-1] // 2
        return q * c + torch.cat((-q[..., h:], q[..., :h]), -1) * s
    if region == "swiglu":
        return F.silu(d["gate"]) * d["up"]
    v = d["x"] + d["residual"] if region == "add_rmsnorm" else d["x"]
    return v * torch.rsqrt((v * v).mean(-1, keepdim=True) + 1e-6) * d["weight"]


def compare_profiles(
    names: list[str] | None = None,
    *,
    tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    seed: int = 0,
    position_offset: int = 4096,
) -> list[RegionResult]:
    """Each region under each profile on one set of random inputs at Qwen2.5-1.5B shapes."""
    names = names or _profiles.names()
    t = _inputs(tokens, dtype, device, seed, position_offset)
    results = []
    for region in OPS:
        oracle = _oracle(region, t)
        hf = _run(region, t, "hf")
        for name in names:
            out = _run(region, t, name)
            err = (out.double() - oracle).abs()
            results.append(
                RegionResult(
                    profile=name,
                    region=region,
                    differs_from_hf=(out != hf).double().mean().item(),
                    max_abs_error=err.max().item(),
                    mean_abs_error=err.mean().item(),
                )
            )
    return results
