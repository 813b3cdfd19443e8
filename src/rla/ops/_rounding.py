"""RN and the output cast, the two roundings every PyTorch reference op is written with.

A module of its own (torch only) so that ``reference`` and the gated product it shares with
``gate`` (``_gated``) both import it downward.
"""

from __future__ import annotations

import torch


def _rn(v: torch.Tensor, lp: torch.dtype) -> torch.Tensor:
    """RN: round an fp32 tensor to ``lp`` and back to fp32 (identity when ``lp`` is fp32)."""
    return v if lp == torch.float32 else v.to(lp).float()


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, ``t`` itself when it already is: a Function's output must not be a no-op
    ``.to``, which torch 2.11's torch.compile (AOT autograd) treats as an alias of an intermediate
    and differentiates to zero (2.13 does not); the numbers are the same either way."""
    return t if t.dtype == dtype else t.to(dtype)
