"""Probe inputs for calibration: the shapes of real models, random and adversarial values, seeded.

A rounding point shows only where two candidate roundings give different bits, so the probes
mix three kinds of values:

- ``random``: N(0, 1) activations, weights near 1 (trained RMSNorm weights sit there) -- what a
  model sees; per_op and fused differ in ~25% of elements here, enough to decide.
- ``ties``: values with at most 4 significant bits (``m * 2**e``). Products of two such numbers
  have at most 8 significant bits, so eager bf16 ops land exactly on representable values or on
  half-way ties far more often than random data does: round-to-nearest-even and the place of each
  rounding are both exercised.
- ``range``: a large dynamic range (scales 2**-20 .. 2**20 within a row): the fp32 sum of squares
  then depends on the order of the reduction, and a norm's rstd on it.
- ``rstd_edge`` (norms): rows whose mean square is 1 or a power of two, so ``rsqrt(mean + eps)``
  falls just below a power of two and ``x * rstd`` just below a bf16 boundary: the rows where a
  rounded and an unrounded normalised value part.

``scale="full"`` gives the hidden sizes of real models (896, 1536, 2048, 3584, 4096, 5120), q/k-norm
rows of 128, head dims 64/128, 1..4096 tokens and positions up to 131072 (for a GPU run);
``scale="small"`` gives a few small shapes with the same value kinds (for CPU tests, where every
Inductor compile costs seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = [
    "NormProbe",
    "SwigluProbe",
    "RopeProbe",
    "norm_probes",
    "swiglu_probes",
    "rope_probes",
    "SCALES",
]

SCALES = ("small", "full")


@dataclass(frozen=True)
class NormProbe:
    """Input of an RMSNorm / residual-add + RMSNorm: x, residual, weight [hidden], eps."""

    name: str
    x: torch.Tensor
    residual: torch.Tensor
    weight: torch.Tensor
    eps: float


@dataclass(frozen=True)
class SwigluProbe:
    """Input of silu_and_mul: ``x = cat(gate, up)`` on the last dim, [tokens, 2 * intermediate]."""

    name: str
    x: torch.Tensor


@dataclass(frozen=True)
class RopeProbe:
    """Input of a rotary embedding: positions [tokens], q [tokens, heads * head_size], k likewise,
    and the parameters the engine builds its cos/sin cache from."""

    name: str
    positions: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    head_size: int
    base: float
    max_position: int
    rope_scaling: dict | None = field(default=None)


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"probe scale must be one of {SCALES}, got {scale!r}")


def _values(kind: str, shape, gen: torch.Generator) -> torch.Tensor:
    """fp32 values of one kind (see the module docstring), on the CPU."""
    if kind == "random":
        return torch.randn(shape, generator=gen)
    if kind == "ties":
        mant = torch.randint(8, 16, shape, generator=gen).float() / 8.0  # 1.000 .. 1.875, 4 bits
        exp = torch.randint(-3, 3, shape, generator=gen).float()
        sign = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1
        return sign * mant * torch.exp2(exp)
    if kind == "range":
        return torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-20, 21, shape, generator=gen).float())
    if kind == "rstd_edge":
        # Rows of +-a with a**2 a power of two: mean square = 2**k exactly.
        rows = shape[0]
        a = torch.exp2(torch.randint(-4, 5, (rows, 1), generator=gen).float() / 2)
        sign = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1
        return sign * a
    raise ValueError(f"unknown probe value kind {kind!r}")


def _weight(kind: str, hidden: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "ties":
        return 1.0 + torch.randint(-8, 9, (hidden,), generator=gen).float() / 16.0
    return 1.0 + 0.1 * torch.randn(hidden, generator=gen)


_KINDS = ("random", "ties", "range", "rstd_edge")


def norm_probes(
    device="cpu", scale: str = "small", seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> list[NormProbe]:
    """Probes for ``rms_norm`` and ``fused_add_rms_norm``: (tokens, hidden) shapes x value kinds.

    q/k-norm shapes (Qwen3: rows of head_dim 128, tokens x heads rows) are included.
    """
    _check_scale(scale)
    if scale == "full":
        shapes = [(1, 896), (17, 1536), (256, 2048), (4096, 3584), (64, 4096), (1024, 5120), (4096 * 16, 128)]
    else:
        shapes = [(16, 896), (48, 128)]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for tokens, hidden in shapes:
        for kind in _KINDS:
            x = _values(kind, (tokens, hidden), gen)
            r = _values("random" if kind == "rstd_edge" else kind, (tokens, hidden), gen)
            if kind == "rstd_edge":
                r = torch.zeros_like(x)  # keep the sum's mean square on the edge for add+norm too
            w = _weight(kind, hidden, gen)
            eps = 1e-6 if hidden != 128 else 1e-6
            out.append(
                NormProbe(
                    f"norm {tokens}x{hidden} {kind}",
                    x.to(dtype).to(device),
                    r.to(dtype).to(device),
                    w.to(dtype).to(device),
                    eps,
                )
            )
    return out


def swiglu_probes(
    device="cpu", scale: str = "small", seed: int = 1, dtype: torch.dtype = torch.bfloat16
) -> list[SwigluProbe]:
    """Probes for ``silu_and_mul`` at the intermediate sizes of real models (per rank)."""
    _check_scale(scale)
    if scale == "full":
        shapes = [(1, 4864), (17, 8960), (256, 11008), (4096, 18944), (64, 14336), (512, 27648)]
    else:
        shapes = [(16, 512)]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for tokens, inter in shapes:
        for kind in ("random", "ties", "range"):
            gate = _values(kind, (tokens, inter), gen) * (3.0 if kind == "random" else 1.0)
            up = _values(kind, (tokens, inter), gen)
            x = torch.cat((gate, up), dim=-1)
            out.append(SwigluProbe(f"swiglu {tokens}x{inter} {kind}", x.to(dtype).to(device)))
    return out


#: Llama-3.1's rope scaling (the config field as HF writes it).
LLAMA31_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def rope_probes(
    device="cpu", scale: str = "small", seed: int = 2, dtype: torch.dtype = torch.bfloat16
) -> list[RopeProbe]:
    """Probes for the rotary embedding: (tokens, q heads, kv heads, head size, theta, scaling,
    cache length), positions drawn over the whole cache (long positions move the angles most)."""
    _check_scale(scale)
    if scale == "full":
        configs = [
            (1, 12, 2, 128, 1e6, None, 32768),  # Qwen2 1.5B decode
            (512, 12, 2, 128, 1e6, None, 32768),  # Qwen2 1.5B prefill
            (4096, 28, 4, 128, 1e6, None, 32768),  # Qwen2 7B
            (256, 16, 8, 128, 1e6, None, 40960),  # Qwen3
            (1024, 32, 8, 128, 5e5, LLAMA31_SCALING, 131072),  # Llama-3.1 8B
            (64, 16, 4, 64, 1e4, None, 4096),  # head dim 64
        ]
    else:
        configs = [
            (24, 2, 1, 128, 1e6, None, 32768),
            (24, 2, 1, 64, 5e5, LLAMA31_SCALING, 131072),
        ]
    gen = torch.Generator().manual_seed(seed)
    out = []
    for tokens, hq, hkv, hd, base, scaling, max_pos in configs:
        for kind in ("random", "ties"):
            positions = torch.randint(0, max_pos, (tokens,), generator=gen)
            positions[-1] = max_pos - 1
            q = _values(kind, (tokens, hq * hd), gen)
            k = _values(kind, (tokens, hkv * hd), gen)
            out.append(
                RopeProbe(
                    f"rope {tokens}x{hq}/{hkv}x{hd} theta={base:g}{' llama3' if scaling else ''} {kind}",
                    positions.to(device),
                    q.to(dtype).to(device),
                    k.to(dtype).to(device),
                    hd,
                    base,
                    max_pos,
                    scaling,
                )
            )
    return out
