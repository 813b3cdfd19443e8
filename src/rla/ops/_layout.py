"""Output layouts of the fused RoPE and q/k norm + RoPE kernels, shared by their launchers and fakes.

A module of its own (torch only, no Triton) so that ``fused`` (the custom ops and their fakes) and
``_triton_rope`` (the launcher) both import it downward instead of importing each other.
"""

from __future__ import annotations

import torch
from torch import Tensor


def output_like(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """A new tensor for the rotation of ``x`` (in ``dtype``, default x's): dense, in x's dimension
    order (x's own strides when x is dense), last stride 1. The kernel addresses an input and its
    output with one set of strides, so an input without that layout (with gaps, e.g. q sliced out
    of a fused qkv projection) is first copied into it. The fake implementations return the same."""
    dtype = dtype or x.dtype
    out = torch.empty_like(x, dtype=dtype)
    return out if out.stride(-1) == 1 else torch.empty(x.shape, dtype=dtype, device=x.device)


def token_major(x: Tensor, head_axis: int, dtype: torch.dtype | None = None) -> Tensor:
    """A new tensor shaped like 4-D ``x`` whose memory is [B, S, H, D] (token-major), returned as
    ``x``'s view: [B, H, S, D] (``head_axis=1``, HF's transposed layout) or [B, S, H, D] (2). The
    fused q/k norm + RoPE writes its outputs and its input gradients so: the layout the two-op
    chain's norm allocates, so every later op sees the chain's strides."""
    dtype = dtype or x.dtype
    if head_axis == 1:
        B, H, S, D = x.shape
        return torch.empty((B, S, H, D), dtype=dtype, device=x.device).transpose(1, 2)
    return torch.empty(x.shape, dtype=dtype, device=x.device)
