"""Shared pieces of the Triton kernels: exact fp32 math and launch helpers.

The spec (docs/rounding.md) writes every fp32 step as one IEEE operation. Three Triton defaults would
break that, so every kernel here is compiled and called through this module:

- contraction: LLVM/ptxas fuse ``a*b + c`` into one FMA (a single rounding instead of two) unless
  the kernel is compiled with ``enable_fp_fusion=False`` -- ``LAUNCH_OPTS`` below; every launch
  passes it;
- division: Triton's fp32 ``/`` is ``div.full.f32`` (about 2 ulp); PyTorch's CUDA kernels use the
  IEEE division (``div.rn``): ``div_rn``;
- exp: ``tl.exp`` is ``ex2.approx`` on a scaled argument; PyTorch's CUDA ``F.silu`` and
  ``torch.sigmoid`` call ``expf`` from CUDA's math library, which is libdevice's ``__nv_expf``:
  ``exp``. ``rsqrt`` is libdevice's ``__nv_rsqrtf``, the function ``torch.rsqrt`` calls, and
  ``tanh`` its ``__nv_tanhf`` (CUDA's ``tanhf``, which ``torch.tanh`` and ``F.gelu`` call).

Under ``TRITON_INTERPRET=1`` (logic checks on a CPU) libdevice does not exist; the same names then
map to ``tl`` ops, which are exact in numpy but not bit-identical to CUDA. Bitwise claims are
only checked on the GPU.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: Passed to every launch: no FMA contraction, so fp32 products and sums round one at a time.
LAUNCH_OPTS: dict = {} if INTERPRET else {"enable_fp_fusion": False}

if INTERPRET:

    @triton.jit
    def exp(x):
        return tl.exp(x)

    @triton.jit
    def div_rn(a, b):
        return a / b

    @triton.jit
    def rsqrt(x):
        return 1.0 / tl.sqrt(x)

    @triton.jit
    def tanh(x):
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def exp(x):
        return libdevice.exp(x)

    @triton.jit
    def div_rn(a, b):
        return libdevice.div_rn(a, b)

    @triton.jit
    def rsqrt(x):
        return libdevice.rsqrt(x)

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints. ``triton.cdiv`` and ``triton.next_power_of_2`` are
    ``ConstexprFunction``s since Triton 3.5: ~6 us of host time per call from Python (a launcher
    made 3-5 such calls), against ~0.1 us for these."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (``triton.next_power_of_2`` without its host cost)."""
    return 1 << (n - 1).bit_length()


_SM_COUNT: dict[int, int] = {}


def sm_count(device) -> int:
    """Multiprocessor count of ``device`` (cached; 4 under the CPU interpreter)."""
    import torch

    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def lp_kind(dtype) -> int:
    """The stack dtype as a constexpr for :func:`to_lp` (a kernel whose output is fp32 still
    rounds its intermediates to the stack dtype)."""
    import torch

    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


@triton.jit
def to_lp(v, LP: tl.constexpr):
    """RN: fp32 ``v`` rounded to the stack dtype ``LP`` (:func:`lp_kind`) and back to fp32."""
    if LP == 1:
        v = v.to(tl.bfloat16).to(tl.float32)
    elif LP == 2:
        v = v.to(tl.float16).to(tl.float32)
    return v
