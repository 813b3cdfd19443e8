"""The LM head as a profile's ``lm_head`` point computes it: logits from the final hidden state.

The point (:mod:`rla.profiles.head`): ``lp`` = RN(h @ W^T + b), the engines' default; ``fp32`` =
h @ W^T + b kept in fp32 (vLLM ``head_dtype=float32``, SGLang ``--enable-fp32-lm-head``). ``lp``
is the stack's low-precision dtype: the autocast dtype where autocast is on for the hidden
state's device, else the hidden state's own dtype (an fp32 stack without autocast rounds nothing,
and both choices compute the same fp32 logits there).

What each operand is, as the engine holds it:

- ``h``: the hidden state in ``lp`` (an fp32 hidden state under autocast is rounded first, as the
  engine's is an ``lp`` tensor; a bf16 one is read as it is).
- ``W``: the engine's copy, ``RN(w)`` of an fp32 master weight (a TRL ``cast_lm_head_to_fp32``
  head), the weight itself when it is already ``lp``. Under ``fp32`` the rounding of an fp32
  master passes the gradient straight through (the weight receives the fp32 gradient of the fp32
  GEMM, not a bf16 copy of it), as the aligned norms treat their fp32 master weights' copies; a
  bf16 weight receives its gradient in bf16, as HF's own head gives it.
- the GEMM itself: PyTorch's (``F.linear`` with autocast off), with fp32 accumulation of lp
  products under ``lp`` and an fp32 GEMM of exactly upcast operands under ``fp32``; its order of
  summation is the running BLAS's, as for every GEMM the rows leave alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla.profiles import HEAD_POINTS, RoundingProfile, resolve

__all__ = ["lm_head", "stack_dtype"]


def stack_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The stack's low-precision dtype for ``hidden``: autocast's where it is on, else its own."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


class _EngineCopy(torch.autograd.Function):
    """RN(w) as fp32 in the forward (the engine's copy of an fp32 master weight); the gradient
    passes to ``w`` unrounded (straight through the rounding)."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, lp: torch.dtype) -> torch.Tensor:
        return w.to(lp).float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _fp32_copy(t: torch.Tensor, lp: torch.dtype) -> torch.Tensor:
    """``t`` as the engine holds it, in fp32: RN(t) for an fp32 master meeting an lp stack."""
    if t.dtype == torch.float32 and lp != torch.float32:
        return _EngineCopy.apply(t, lp)
    return t.float()


def lm_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            profile: str | RoundingProfile, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The logits of ``hidden`` [..., H] under ``profile``'s ``lm_head`` point -> [..., V].

    ``weight`` [V, H] and ``bias`` [V] (or None) are the head's parameters in any dtype;
    ``dtype`` the stack's low-precision dtype (default :func:`stack_dtype`). The result is an
    ``lp`` tensor under ``lm_head='lp'`` and an fp32 tensor under ``lm_head='fp32'``; both are
    differentiable in ``hidden``, ``weight`` and ``bias``.
    """
    p = resolve(profile)
    if p.lm_head not in HEAD_POINTS["lm_head"]:  # a profile built around the checks
        raise ValueError(f"profile {p.name!r}: lm_head={p.lm_head!r} is not one of {HEAD_POINTS['lm_head']}")
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"lm_head: the hidden state's last dim is {hidden.shape[-1]}, the weight's is "
                         f"{weight.shape[-1]} ([vocab, hidden] expected)")
    lp = stack_dtype(hidden) if dtype is None else dtype
    with torch.autocast(hidden.device.type, enabled=False):
        h = hidden.to(lp)
        if p.lm_head == "lp":
            return F.linear(h, weight.to(lp), None if bias is None else bias.to(lp))
        return F.linear(h.float(), _fp32_copy(weight, lp), None if bias is None else _fp32_copy(bias, lp))
