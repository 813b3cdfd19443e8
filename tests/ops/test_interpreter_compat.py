"""``interpreter_compat.fix_scalar_index``, the repair the interpreter tests apply to Triton 3.6's
interpreter under NumPy >= 2.4 (its docstring says why): a kernel looping ``tl.range`` over a
runtime bound runs and sums right; the repair is made exactly where this Triton's interpreter
cannot read a shape-(1,) scalar, once, and is undone with the interpreter's own patches after
each launch. Under Triton 3.6 with NumPy >= 2.4 the kernel fails without it (checked by hand:
the TypeError "only 0-dimensional arrays can be converted to Python scalars")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

import interpreter_compat

SCRIPT = textwrap.dedent('''
    import numpy as np
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as interp

    import interpreter_compat

    try:
        int(np.array([3]))
        numpy_refuses = False
    except TypeError:  # NumPy >= 2.4
        numpy_refuses = True
    old_triton = tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7)
    plain = interp._patch_lang_tensor
    applied = interpreter_compat.fix_scalar_index()
    assert applied == (numpy_refuses and old_triton), (applied, triton.__version__, np.__version__)
    assert applied == (interp._patch_lang_tensor is not plain)
    assert interpreter_compat.fix_scalar_index() is False  # repaired once
    before = tl.core.tensor.__dict__.get("__index__")

    @triton.jit
    def column_sums(x_ptr, out_ptr, n, STEP: tl.constexpr):
        cols = tl.arange(0, STEP)
        acc = tl.zeros([STEP], dtype=tl.float32)
        for i in tl.range(0, n, STEP):  # n: a runtime scalar, the norm backward's kind of bound
            acc += tl.load(x_ptr + i + cols, mask=i + cols < n, other=0.0)
        tl.store(out_ptr + cols, acc)

    x = torch.arange(1, 38, dtype=torch.float32)  # 37 values: the last step is partial
    out = torch.empty(4)
    column_sums[(1,)](x, out, x.numel(), STEP=4)
    want = torch.cat([x, x.new_zeros(3)]).view(10, 4).sum(0)  # small integers: exact in any order
    assert torch.equal(out, want), (out, want)
    assert tl.core.tensor.__dict__.get("__index__") is before  # undone after the launch
    print("ok", applied)
''')


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_range_over_a_runtime_bound_runs_under_the_interpreter():
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=interpreter_compat.subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-4000:]
