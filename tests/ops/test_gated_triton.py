"""rla's fused kernels of the newer families' gated MLPs -- GeGLU (``rla.ops._triton_geglu``) and
GPT-OSS's clamped SwiGLU (``rla.ops._triton_swiglu_oai``) -- against the reference ops.

- CPU, under Triton's interpreter (the kernels' Python bodies through numpy, in a subprocess: the
  interpreter is chosen at import): both doors of the op, forward and backward, per_op and fused,
  bf16 and fp32, a length that is not a multiple of the block, against ``rla.ops.reference.geglu``
  -- to fp32 rounding in fp32 (the interpreter has no libdevice: its tanh is written with exp), to
  one bf16 step in bf16 (its fp32 -> bf16 cast truncates), and per_op and fused must differ. A
  logic check: indices, masks, flags, the backward's formulas.
  The clamped SwiGLU takes the strided halves of an interleaved gate_up, gates past the limit and
  ups past +-limit (the clamps and their zeroed gradients).
- GPU (``gpu``): ``rla.ops.geglu`` and ``rla.ops.swiglu_oai`` on CUDA (the fused kernels) equal the
  reference bit for bit, forward and both gradients, over the activations' whole range.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import interpreter_compat

SCRIPT = r'''
import interpreter_compat
interpreter_compat.fix_scalar_index()
import torch
from rla import profiles
from rla.ops import _triton_geglu, _triton_swiglu_oai, fused, reference

for kernels in (_triton_geglu, _triton_swiglu_oai):  # small blocks: several programs, the last one masked
    kernels.FWD_BLOCK = kernels.BWD_BLOCK = 256

def grads(fn, g, u, dy):
    g, u = g.detach().requires_grad_(True), u.detach().requires_grad_(True)
    out = fn(g, u)
    return (out, *torch.autograd.grad(out, (g, u), dy))

checked = 0
gen = torch.Generator().manual_seed(0)
for dtype, n in ((torch.bfloat16, 600), (torch.float32, 300)):
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

ALPHA, LIMIT = 1.702, 7.0
for dtype, n in ((torch.bfloat16, 600), (torch.float32, 300)):
    gu = torch.randn(n, 2, generator=gen) * 6  # past the limit both ways, gates and ups
    gu[:4, 0] = torch.tensor([7.0, 7.5, -30.0, 0.0])
    gu[:4, 1] = torch.tensor([-7.0, -7.5, 7.25, 8.0])
    gu, dy = gu.to(dtype), torch.randn(n, generator=gen).to(dtype)
    g, u = gu[:, 0], gu[:, 1]  # strided halves, as GPT-OSS's experts hand them over
    outs = {}
    for name in ("hf", "vllm", "vllm-0.33-eager"):  # per_op; fused via the sigmoid; fused as one quotient
        prof = profiles.get(name) if name != "vllm-0.33-eager" else profiles.get(name).variant("gpt_oss")
        assert name != "vllm-0.33-eager" or prof.oai_glu == "quotient"
        run = lambda a, b: fused._SWIGLU_OAI.function.apply(a, b, ALPHA, LIMIT, prof.swiglu == "per_op",
                                                            prof.oai_glu == "quotient")
        got = grads(run, g, u, dy)
        want = grads(lambda a, b: reference.swiglu_oai(a, b, ALPHA, LIMIT, prof), g, u, dy)
        for x, y, what in zip(got, want, ("out", "d_gate", "d_up")):
            assert x.dtype == y.dtype and x.shape == y.shape, (name, what)
            if dtype == torch.float32:
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=f"oai {name} {what}")
            else:  # per_op rounds four times, each cast truncating here: a few bf16 steps apart
                torch.testing.assert_close(x.float(), y.float(), rtol=2 ** -5, atol=2e-2, msg=f"oai {name} {what}")
            checked += 1
        assert bool((got[1][1] == 0) & (got[2][1] == 0)) and bool(got[2][3] == 0)  # the clamps zero their gradient
        outs[name] = got[0]
    if dtype == torch.bfloat16:
        assert not torch.equal(outs["hf"], outs["vllm"])
    else:  # fp32 stores: the two fused orders' own roundings show
        assert not torch.equal(outs["vllm"], outs["vllm-0.33-eager"])
print("ok", checked)
'''


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_gated_kernels_under_the_interpreter():
    env = interpreter_compat.subprocess_env()
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok 36" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["geglu", "swiglu_oai"])
@pytest.mark.parametrize("name", ["hf", "vllm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_gated_mlp_is_the_reference_bit_for_bit(op, name, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from rla import ops, profiles
    from rla.ops import fused, reference

    assert fused.available(torch.zeros(1, device="cuda"))
    prof = profiles.get(name)
    if op == "geglu":
        ours, theirs = (lambda a, b: ops.geglu(a, b, name)), (lambda a, b: reference.geglu(a, b, prof))
    else:  # GPT-OSS's alpha and limit, on the strided halves of an interleaved gate_up
        ours = lambda a, b: ops.swiglu_oai(a, b, 1.702, 7.0, name)
        theirs = lambda a, b: reference.swiglu_oai(a, b, 1.702, 7.0, prof)
    for seed, shape in enumerate([(1024, 4864), (3, 7, 129)]):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        gu = torch.randn((*shape, 2), device="cuda", generator=gen) * 4
        flat = gu.view(-1)
        m = min(8000, flat.numel())
        flat[:m] = torch.linspace(-16, 16, m, device="cuda")  # both saturations, past the limits
        gu = gu.to(dtype)
        gate, up = (gu[..., 0], gu[..., 1]) if op == "swiglu_oai" else (gu[..., 0].contiguous(), gu[..., 1].contiguous())
        dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        outs = []
        for fn in (ours, theirs):
            a, b = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
            out = fn(a, b)
            outs.append((out, *torch.autograd.grad(out, (a, b), dy)))
        for x, y, what in zip(*outs, ("out", "d_gate", "d_up")):
            bits = {2: torch.int16, 4: torch.int32}[x.element_size()]  # -0.0 and NaN payloads count
            x, y = x.contiguous(), y.contiguous()
            assert x.dtype == y.dtype and torch.equal(x.view(bits), y.view(bits)), \
                f"{op} {name} {dtype} {shape} {what}: {(x.view(bits) != y.view(bits)).sum().item()} of {x.numel()} differ"
