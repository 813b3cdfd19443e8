"""What the tests that run Triton kernels under ``TRITON_INTERPRET=1`` share: the subprocess's
environment, one repair to Triton 3.6's interpreter (below), and, for the tests that hold an engine's
own kernel to rla bit for bit, the interpreter's fp32 -> bf16 cast made round-to-nearest
(:func:`round_bf16_casts`).

Triton's interpreter holds a kernel's scalar arguments (``M``, ``rows_per_program``...) as numpy
arrays of shape (1,), and ``tl.range(0, n)`` / ``range(n)`` over such a scalar calls the tensor's
``__index__``. Triton 3.6 (the release torch 2.11 pins) writes that as ``int(self.handle.data)``;
NumPy 2.4 turned its deprecation of ``int()`` on an array with ndim > 0 into a ``TypeError`` ("only
0-dimensional arrays can be converted to Python scalars"). So under Triton 3.6 with NumPy >= 2.4
every kernel looping over a runtime bound -- the norm backward's persistent row loop, which the
norm, add + norm, residual-source and q/k norm + RoPE checks all reach -- fails before computing
anything. Triton 3.7 and later write ``int(self.handle.data.squeeze())``. :func:`fix_scalar_index`
installs that same ``__index__`` where this Triton's does not accept a shape-(1,) scalar, and
nothing otherwise; it changes no arithmetic (the interpreter's casts, fp32 -> bf16 by truncation,
are the same code in 3.6 and 3.9).
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def subprocess_env() -> dict:
    """``os.environ`` with ``TRITON_INTERPRET=1`` and, on ``PYTHONPATH`` before what was there,
    the repository's ``src`` and this folder (so a ``-c`` script can import this module)."""
    from repo_root import ROOT

    return dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _index_accepts_shape_one(interp) -> bool:
    """Whether this interpreter's patched ``tl.tensor.__index__`` reads a shape-(1,) scalar."""
    import operator
    import types

    import numpy as np

    class Probe:
        pass

    scope = interp._LangPatchScope()
    try:
        interp._patch_lang_tensor(Probe, scope)
        probe = Probe()
        probe.handle = types.SimpleNamespace(data=np.array([3], dtype=np.int32))
        try:
            return operator.index(probe) == 3
        except TypeError:
            return False
    finally:
        scope.restore()


def fix_scalar_index() -> bool:
    """Give this Triton's interpreter Triton 3.7's ``__index__`` where its own fails on the
    shape-(1,) arrays that hold scalars (Triton 3.6 with NumPy >= 2.4). -> whether it did."""
    from triton.runtime import interpreter as interp

    if not all(hasattr(interp, n) for n in ("_patch_lang_tensor", "_LangPatchScope")):
        return False  # another interpreter than 3.6-3.9's: the kernel checks say if it works
    if _index_accepts_shape_one(interp):
        return False
    plain = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        plain(tensor, scope)
        # set through the scope, so the interpreter's restore undoes it with the rest
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interp._patch_lang_tensor = patch_lang_tensor  # looked up as a module global at each launch
    assert _index_accepts_shape_one(interp), "the __index__ repair did not take"
    return True


def round_bf16_casts() -> None:
    """Make the interpreter's fp32 -> bf16 cast round to nearest even, as the compiled kernel's
    ``cvt.rn`` and ``tensor.to(torch.bfloat16)`` do (the interpreter truncates the mantissa); every
    other cast stays the interpreter's. For the tests that compare an engine's own Triton kernel,
    run interpreted, with rla bit for bit (tests/engines/test_sglang_families.py, test_vllm_families.py)."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    plain = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rne = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return interpreter.TensorHandle(rne.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return plain(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl

