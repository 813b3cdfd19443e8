"""Training-side RoPE, SwiGLU and RMSNorm that round exactly where a chosen engine does.

``profile`` is a profile name (``"vllm"``) or a :class:`rla.profiles.RoundingProfile`. The
low-precision dtype is the input's (bf16 or fp16); on fp32 inputs nothing is rounded. All four ops
are differentiable. On CUDA they run the fused kernels of ``rla.ops.fused`` when Triton is
available; everywhere else the PyTorch reference of ``rla.ops.reference``, which is the oracle
the fused kernels are tested against. ``launch_config()`` / ``set_launch_config(dict)`` read and
set the fused kernels' launch parameters (:mod:`rla.ops.launch`).
"""

from __future__ import annotations

import torch

from rla.ops import reference
from rla.ops._checks import check_norm, check_rope, check_swiglu
from rla.ops.launch import launch_config, set_launch_config
from rla.profiles import RoundingProfile, resolve

__all__ = ["rope", "swiglu", "rms_norm", "add_rms_norm", "backend", "launch_config", "set_launch_config"]


def backend(*tensors: torch.Tensor):
    """The implementation module that will run for these tensors (``fused`` or ``reference``)."""
    if any([t.is_cuda for t in tensors]):  # a list, not a generator: traced by Dynamo everywhere
        try:
            from rla.ops import fused
        except ImportError:  # the fused path is optional; the reference is always there
            return reference
        if fused.available(*tensors):
            return fused
    return reference


def rope(q, k, cos, sin, profile: str | RoundingProfile, unsqueeze_dim: int = 1, dtype: torch.dtype | None = None):
    """Rotary position embedding of ``q`` and ``k`` -> ``(q_out, k_out)``.

    Same call as HF's ``apply_rotary_pos_emb``, with fp32 ``cos``/``sin``: the profile decides
    whether they are rounded to the input dtype (``rope_cos_sin``) and whether the two products
    are rounded before the sum (``rope_apply``). ``cos``/``sin`` may also be half tables
    [..., D/2], the first half of HF's [..., D] (which repeats it), as vLLM caches them: the
    same numbers from a quarter of the bytes when already rounded to q's dtype.

    ``dtype`` is the stack's low-precision dtype (default q's): fp32 ``q``/``k`` with
    ``dtype=torch.bfloat16`` are unrounded q/k-norm outputs (``qk_norm_out='fp32'``), read as
    they are and rounded once at the output.
    """
    p = resolve(profile)
    check_rope(q, k, cos, sin, p, unsqueeze_dim, dtype)
    return backend(q, k).rope(q, k, cos, sin, p, unsqueeze_dim, dtype)


def swiglu(gate, up, profile: str | RoundingProfile):
    """silu(gate) * up, rounded where ``profile.swiglu`` says."""
    p = resolve(profile)
    check_swiglu(gate, up)
    return backend(gate, up).swiglu(gate, up, p)


def rms_norm(
    x, weight, eps: float, profile: str | RoundingProfile, dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
):
    """RMSNorm over the last dim; an fp32 ``weight`` is first rounded to the low-precision dtype.

    ``dtype`` is the stack's low-precision dtype and defaults to ``x.dtype``. Passing an fp32
    ``x`` with ``dtype=torch.bfloat16`` reads ``x`` as the fp32 residual sum of a fused add + norm
    (the ``fp32_sum`` point across a decoder-layer boundary) and returns a bf16 result.
    ``out_dtype=torch.float32`` returns the norm unrounded (a q/k norm feeding RoPE under
    ``qk_norm_out='fp32'``).
    """
    p = resolve(profile)
    check_norm(x, None, weight, eps, dtype)
    if out_dtype not in (None, torch.float32) and out_dtype != (dtype or x.dtype):
        raise TypeError(f"out_dtype must be None (the stack dtype) or torch.float32, got {out_dtype}")
    return backend(x, weight).rms_norm(x, weight, eps, p, dtype, out_dtype)


def add_rms_norm(x, residual, weight, eps: float, profile: str | RoundingProfile):
    """Residual add + RMSNorm -> ``(normed, new_residual)``.

    ``new_residual`` is RN(x + residual) under every profile; the norm reads that rounded sum or
    the fp32 sum, as ``profile.norm_residual`` says.
    """
    p = resolve(profile)
    check_norm(x, residual, weight, eps)
    return backend(x, residual, weight).add_rms_norm(x, residual, weight, eps, p)
