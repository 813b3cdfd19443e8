"""Round to fewer mantissa bits: the dose of the dose-response experiment (issue #19).

``round_mantissa(x, bits)`` rounds every element of ``x`` to the nearest number of a binary
floating-point format with ``bits`` explicit mantissa bits and bf16's (= fp32's) exponent range,
ties to even, and returns it in ``x``'s dtype. ``bits=7`` is bf16 itself, ``bits=10`` has fp16's
precision (not its range), ``bits=23`` is fp32. Precisely, for a finite fp32 value ``v`` with
``|v|`` in the binade ``[2^e, 2^(e+1))`` the result is ``q * n`` with quantum
``q = 2^(max(e, -126) - bits)`` and ``n`` the integer nearest ``v / q`` (ties to the even ``n``),
so subnormals keep bf16's spacing ``2^(-126 - bits)``; a value that rounds to ``2^128`` or beyond
becomes ``inf`` with its sign; ``±0``, ``±inf`` and NaN pass through. It is what
``tensor.to(torch.bfloat16)`` does to fp32 for ``bits=7``, generalised to any ``bits`` in
``[1, 23]``, and is computed the same way: on the fp32 bit pattern, adding half a quantum minus
one plus the kept lowest bit and clearing the dropped bits (carries into the exponent are the
correct binade change and overflow to ``inf``).

Inputs are bf16 or fp32 (both share the exponent range, so nothing else changes); a bf16 input
with ``bits >= 7`` and an fp32 input with ``bits = 23`` are returned unchanged. Other dtypes are
refused: fp16's exponent range is not bf16's. ``bits = 0`` is refused too: with no explicit
mantissa bit every number's significand is 1, so "ties to even" does not say which neighbour to
take (the bit-pattern trick would pick the even *exponent*, a convention of its own).

Gradient: straight-through (``d round(x) / dx := 1``), as every rounding in ``rla.ops`` (see
``rla.ops.reference``): the dose changes what the training forward computes, and the backward
differentiates the unrounded function, as a trainer whose kernels round more coarsely would.
"""

from __future__ import annotations

import torch

__all__ = ["round_mantissa", "round_mantissa_values", "MAX_BITS"]

#: fp32's explicit mantissa bits: the most the format can keep (no rounding at all).
MAX_BITS = 23

_NATIVE_BITS = {torch.bfloat16: 7, torch.float32: 23}


def _check(x: torch.Tensor, bits: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"round_mantissa: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in _NATIVE_BITS:
        raise TypeError(
            f"round_mantissa: x must be bf16 or fp32 (bf16's exponent range), got {x.dtype}; fp16 has "
            "another exponent range"
        )
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"round_mantissa: bits must be an int in [1, {MAX_BITS}], got {bits!r}")


def round_mantissa_values(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The rounding itself, forward only (no autograd): see the module docstring."""
    _check(x, bits)
    if bits >= _NATIVE_BITS[x.dtype]:
        return x
    f = x.detach().to(torch.float32)  # exact for bf16
    shift = MAX_BITS - bits
    i = f.view(torch.int32)
    keep_lsb = torch.bitwise_and(torch.bitwise_right_shift(i, shift), 1)
    rounded = torch.bitwise_and(i + ((1 << (shift - 1)) - 1) + keep_lsb, ~((1 << shift) - 1))
    out = torch.where(torch.isnan(f), f, rounded.view(torch.float32))
    return out.to(x.dtype)  # exact for bf16 (bits < 7 here, same exponent range)


class _RoundMantissa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bits):
        return round_mantissa_values(x, bits)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` rounded to ``bits`` explicit mantissa bits (RNE, bf16 exponent range), same dtype;
    straight-through gradient. See the module docstring for the exact definition."""
    _check(x, bits)
    if bits >= _NATIVE_BITS[x.dtype]:
        return x
    return _RoundMantissa.apply(x, bits)
