"""Shared by the ops tests that run the fused kernels under Triton's interpreter (CPU tensors)
and ``opcheck`` their custom ops on a GPU: the skip marks, the script runner, opcheck's inputs.

A script is the body of a ``python -c`` run under ``interpreter_compat.subprocess_env()``
(``TRITON_INTERPRET=1``, ``src`` and this folder on ``PYTHONPATH``). :func:`run_script` puts
:data:`PRELUDE` before it: the interpreter's repair (``interpreter_compat.fix_scalar_index``,
Triton 3.6 with NumPy >= 2.4), then ``torch`` and this module's :func:`same` and
:func:`below_half`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import interpreter_compat

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available() and HAS_TRITON
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (its interpreter)")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and Triton")

PRELUDE = """\
import interpreter_compat
interpreter_compat.fix_scalar_index()
import torch
from interpreted_scripts import below_half, same
"""


def run_script(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``script`` after :data:`PRELUDE` in a Python subprocess under the interpreter."""
    return subprocess.run([sys.executable, "-c", PRELUDE + script], env=interpreter_compat.subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def tail(run: subprocess.CompletedProcess) -> str:
    """What a failed run printed last: the end of its stdout, then of its stderr."""
    return run.stdout[-2000:] + run.stderr[-4000:]


# ------------------------------------------------------------------ inside a script


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)


def below_half(t, g):
    """fp32 values whose bits below bf16's are under half a bf16 ulp (and not zero): the
    interpreter's fp32 -> bf16 cast truncates, which is RN(t) on these, and RN(t) != t."""
    low = torch.randint(1, 0x8000, t.shape, generator=g, dtype=torch.int32)
    return ((t.view(torch.int32) & -0x10000) | low).view(torch.float32)


# ------------------------------------------------------------------ opcheck (GPU)


def leaf(t):
    """A fresh leaf that needs grad, for an opcheck argument."""
    return t.detach().clone().requires_grad_(True)


def source_inputs(wdtype, rows=16, hidden=96, device="cuda"):
    """(s fp32, x bf16, w, g) of the add + norm custom ops' opcheck: the fp32 sum s, the branch
    output x, the norm weight in ``wdtype``, and the generator they were drawn from (for what a
    test draws next)."""
    g = torch.Generator(device=device).manual_seed(0)
    s = torch.randn(rows, hidden, device=device, generator=g) * 3
    x = torch.randn(rows, hidden, device=device, generator=g).to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(hidden, device=device, generator=g)).to(wdtype)
    return s, x, w, g
