"""Input validation shared by every implementation of the ops: errors that name the problem."""

from __future__ import annotations

import math

import torch

from rla.profiles import RoundingProfile

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; rla ops take bfloat16, float16 or float32 tensors"
        )


def _same_dtype(names: str, *ts: torch.Tensor) -> None:
    if len({t.dtype for t in ts}) != 1:
        raise TypeError(f"{names} must share one dtype, got {', '.join(str(t.dtype) for t in ts)}")


def _same_device(names: str, *ts: torch.Tensor) -> None:
    if len({t.device for t in ts}) != 1:
        raise ValueError(f"{names} must be on one device, got {', '.join(str(t.device) for t in ts)}")


def _stack_dtype(name: str, t: torch.Tensor, dtype, fp32_is: str) -> torch.dtype:
    """The stack dtype (``dtype``, default ``t``'s); ``t`` must be in it, or fp32 meaning ``fp32_is``."""
    lp = t.dtype if dtype is None else dtype
    if lp not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    if t.dtype not in (lp, torch.float32):
        raise TypeError(f"{name} is {t.dtype} but the stack dtype is {lp}: {name} must be {lp}, or {fp32_is}")
    return lp


def check_rope(q, k, cos, sin, profile: RoundingProfile, unsqueeze_dim: int, dtype=None) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _float(name, t)
    _same_dtype("q and k", q, k)
    lp = _stack_dtype("q", q, dtype, "the fp32 output of a q/k norm (qk_norm_out='fp32')")
    _same_device("q, k, cos and sin", q, k, cos, sin)
    d = q.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dim, got {d} (q shape {tuple(q.shape)})")
    if k.shape[-1] != d or cos.shape[-1] not in (d, d // 2) or sin.shape != cos.shape:
        raise ValueError(
            "RoPE shapes disagree: q and k must end in the same head dim D, cos/sin in D (HF's "
            "table) or D/2 (its first half; the rotate-half convention repeats it), and cos/sin "
            f"must match; got q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)}"
        )
    if q.ndim != k.ndim:
        raise ValueError(f"q and k must have the same rank, got {q.ndim} and {k.ndim}")
    if cos.dtype != torch.float32:
        if profile.rope_cos_sin == "fp32":
            raise TypeError(
                f"profile {profile.name!r} keeps cos/sin in fp32 (rope_cos_sin='fp32') but cos/sin "
                f"arrived as {cos.dtype}: they were already rounded, which is the error being "
                "aligned away. Compute cos/sin in fp32 from an fp32 inv_freq. Under FSDP2 the usual "
                "cause is MixedPrecisionPolicy(cast_forward_inputs=True), the default, which casts "
                "every module input to param_dtype: use cast_forward_inputs=False."
            )
        if cos.dtype != lp:
            raise TypeError(
                f"cos/sin are {cos.dtype} but the stack dtype is {lp}; pass fp32 cos/sin (preferred) "
                "or cos/sin already rounded to it"
            )
    shape = [*cos.shape[:-1], d]
    pos = unsqueeze_dim if unsqueeze_dim >= 0 else len(shape) + 1 + unsqueeze_dim
    if not 0 <= pos <= len(shape) or not (_broadcastable(q.shape, shape[:pos] + [1] + shape[pos:])
                                         and _broadcastable(k.shape, shape[:pos] + [1] + shape[pos:])):
        raise ValueError(
            f"cos/sin {tuple(cos.shape)} unsqueezed at dim {unsqueeze_dim} do not broadcast "
            f"against q {tuple(q.shape)} and k {tuple(k.shape)}"
        )


def _broadcastable(a, b) -> bool:
    """Shape ``b`` broadcasts to ``a`` (plain ints: this runs on every call, host time matters)."""
    if len(b) > len(a):
        return False
    return all(y == 1 or x == y for x, y in zip(reversed(a), reversed(b)))


def check_pair(a, b, names: tuple[str, str]) -> None:
    """The two operands of a gated product (swiglu's gate and up, attn_gate's attn and gate): float
    tensors of one dtype, device and shape; errors name them as the caller's arguments (``names``)."""
    na, nb = names
    _float(na, a)
    _float(nb, b)
    both = f"{na} and {nb}"
    _same_dtype(both, a, b)
    _same_device(both, a, b)
    if a.shape != b.shape:
        raise ValueError(f"{both} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_norm(x, residual, weight, eps, dtype=None) -> None:
    _float("x", x)
    lp = _stack_dtype("x", x, dtype, "an fp32 residual sum")
    _float("weight", weight)
    tensors = [x, weight]
    if residual is not None:
        _float("residual", residual)
        _same_dtype("x and residual", x, residual)
        if residual.shape != x.shape:
            raise ValueError(
                f"x and residual must have the same shape, got {tuple(x.shape)} and "
                f"{tuple(residual.shape)}"
            )
        tensors.append(residual)
    _same_device("x, residual and weight", *tensors)
    if x.ndim < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"weight shape {tuple(weight.shape)} must equal the last dim of x {tuple(x.shape)}"
        )
    if weight.dtype not in (lp, torch.float32):
        raise TypeError(
            f"weight is {weight.dtype} but the stack dtype is {lp}; the weight must be {lp} or an fp32 "
            "master weight (which is rounded to x's dtype, like the engine's copy)"
        )
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite non-negative number, got {eps!r}")


def _unrounded(name: str, s, of, of_name: str, dtype_error: str, shape_error: str) -> None:
    """``s`` (the argument ``name``): the fp32 tensor that ``of`` (``of_name``) was rounded from, so of its
    shape and device. ``dtype_error`` is formatted with ``got`` (s's dtype), ``shape_error`` with ``shape``
    (of's) and ``got`` (s's)."""
    _float(name, s)
    if s.dtype != torch.float32:
        raise TypeError(dtype_error.format(got=s.dtype))
    if s.shape != of.shape:
        raise ValueError(shape_error.format(shape=tuple(of.shape), got=tuple(s.shape)))
    _same_device(f"{of_name} and {name}", of, s)


def check_variance_of(x, s) -> None:
    """``rms_norm(variance_of=)``: an fp32 tensor of x's shape and device (the value x was rounded from)."""
    _unrounded("variance_of", s, x, "x",
               "variance_of must be fp32 (the unrounded value whose mean square the norm takes), got {got}",
               "x and variance_of must have the same shape, got {shape} and {got}")


def check_residual_source(residual, source) -> None:
    """``add_rms_norm(residual_source=)``: an fp32 tensor of the residual's shape and device."""
    _unrounded("residual_source", source, residual, "residual",
               "residual_source must be the fp32 tensor the residual was rounded from, got {got}",
               "residual_source must have the residual's shape {shape}, got {got}")


def check_carry_add(x, residual, m) -> None:
    for name, t in (("x", x), ("residual", residual), ("m", m)):
        _float(name, t)
    if not (x.shape == residual.shape == m.shape):
        raise ValueError(f"carry_add: shapes differ: x {tuple(x.shape)}, residual {tuple(residual.shape)}, m {tuple(m.shape)}")
    _same_device("x, residual and m", x, residual, m)
