"""rla's fused GeGLU kernels (``rla.ops._triton_geglu``) against the reference op.

- CPU, under Triton's interpreter (the kernels' Python bodies through numpy, in a subprocess: the
  interpreter is chosen at import): both doors of the op, forward and backward, per_op and fused,
  bf16 and fp32, a length that is not a multiple of the block, against ``rla.ops.reference.geglu``
  -- to fp32 rounding in fp32 (the interpreter has no libdevice: its tanh is written with exp), to
  one bf16 step in bf16 (its fp32 -> bf16 cast truncates), and per_op and fused must differ. A
  logic check: indices, masks, flags, the backward's formulas.
- GPU (``gpu``): ``rla.ops.geglu`` on CUDA (the fused kernel) equals the reference bit for bit,
  forward and both gradients, over gelu's whole range (``tests/ops/test_fused_gpu.py``'s gates).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from repo_root import ROOT

SCRIPT = r'''
import torch
from rla import profiles
from rla.ops import fused, reference

def grads(fn, g, u, dy):
    g, u = g.detach().requires_grad_(True), u.detach().requires_grad_(True)
    out = fn(g, u)
    return (out, *torch.autograd.grad(out, (g, u), dy))

checked = 0
gen = torch.Generator().manual_seed(0)
for dtype, n in ((torch.bfloat16, 2100), (torch.float32, 700)):  # 2100: two programs of 2048, the second masked
    g = (torch.randn(n, generator=gen) * 3)
    g[:6] = torch.tensor([0.0, -0.0, 10.0, -10.0, 1e-3, -30.0])
    g, u, dy = g.to(dtype), torch.randn(n, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    outs = {}
    for name in ("hf", "vllm"):  # swiglu per_op, fused
        prof = profiles.get(name)
        for door in ("function", "custom_op")[:2 if dtype == torch.float32 else 1]:
            run = (lambda a, b: fused._GEGLU.function.apply(a, b, prof.swiglu == "per_op")) if door == "function" \
                else (lambda a, b: fused._GEGLU.custom_op(a, b, prof.swiglu == "per_op"))
            got = grads(run, g, u, dy)
            want = grads(lambda a, b: reference.geglu(a, b, prof), g, u, dy)
            for x, y, what in zip(got, want, ("out", "d_gate", "d_up")):
                assert x.dtype == y.dtype and x.shape == y.shape, (name, door, what)
                if dtype == torch.float32:
                    torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=f"{name} {door} {what}")
                else:  # the interpreter's fp32 -> bf16 cast truncates: one bf16 step (2**-7 relative) apart
                    torch.testing.assert_close(x.float(), y.float(), rtol=2 ** -6, atol=1e-2)
                checked += 1
            outs[name, door] = got[0]
    if dtype == torch.bfloat16:
        assert not torch.equal(outs["hf", "function"], outs["vllm", "function"])  # the flag reaches the kernel
print("ok", checked)
'''


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_geglu_kernels_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok 18" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["hf", "vllm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_geglu_fused_is_the_reference_bit_for_bit(name, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rla import ops, profiles
    from rla.ops import fused, reference

    assert fused.available(torch.zeros(1, device="cuda"))
    prof = profiles.get(name)
    for seed, shape in enumerate([(1024, 4864), (3, 7, 129)]):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        gate = torch.randn(shape, device="cuda", generator=gen) * 3
        flat = gate.view(-1)
        m = min(4000, flat.numel())
        flat[:m] = torch.linspace(-12, 12, m, device="cuda")  # gelu's tanh range, both saturations
        gate = gate.to(dtype)
        up = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        outs = []
        for fn in (lambda a, b: ops.geglu(a, b, name), lambda a, b: reference.geglu(a, b, prof)):
            a, b = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
            out = fn(a, b)
            outs.append((out, *torch.autograd.grad(out, (a, b), dy)))
        for x, y, what in zip(*outs, ("out", "d_gate", "d_up")):
            bits = {2: torch.int16, 4: torch.int32}[x.element_size()]  # -0.0 and NaN payloads count
            assert x.dtype == y.dtype and torch.equal(x.view(bits), y.view(bits)), \
                f"geglu {name} {dtype} {shape} {what}: {(x.view(bits) != y.view(bits)).sum().item()} of {x.numel()} differ"
