"""Output layout of the fused RoPE kernel, shared by its launcher and its fake implementation.

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
