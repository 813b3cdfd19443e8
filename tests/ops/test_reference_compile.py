"""rla.ops.reference's autograd Functions under torch.compile: the input gradients equal eager's, in
particular where a Function's output already has the dtype it is cast to (carry_add into fp32, a norm with
an fp32 output, RoPE of fp32 q/k). Under torch 2.11, such an output written as a no-op ``.to`` differentiated
to all zeros in a compiled graph (a compiled aligned Qwen3 got gradients in 2 of its 25 parameters); torch 2.13
does not show it, so on CI's torch these tests pass either way and the 2.11 run is what they guard."""

from __future__ import annotations

import pytest
import torch

from rla import profiles
from rla.ops import reference as R

P = profiles.get("vllm")
BF16, F32 = torch.bfloat16, torch.float32


def _grads(fn, inputs, compile_: bool):
    xs = [x.clone().requires_grad_(True) for x in inputs]
    f = torch.compile(fn, backend="aot_eager", fullgraph=True) if compile_ else fn
    out = f(*xs)
    out = out if isinstance(out, tuple) else (out,)
    sum(o.float().sum() for o in out).backward()
    torch._dynamo.reset()
    return [x.grad for x in xs]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _w(dev):
    return torch.linspace(0.5, 1.5, 64, device=dev).to(BF16)


def _cos_sin(dev):
    return torch.full((1, 16, 64), 0.6, device=dev), torch.full((1, 16, 64), 0.8, device=dev)


CASES = {
    "carry_add into fp32": (lambda dev: lambda a, r, m: R.carry_add(a, r, m, F32), [BF16, BF16, BF16]),
    "carry_add into bf16": (lambda dev: lambda a, r, m: R.carry_add(a, r, m, BF16), [BF16, BF16, BF16]),
    "rms_norm, fp32 output": (lambda dev: lambda x: R.rms_norm(x, _w(dev), 1e-6, P, out_dtype=F32), [BF16]),
    "rms_norm of fp32 into bf16": (lambda dev: lambda x: R.rms_norm(x, _w(dev), 1e-6, P, dtype=BF16, after_add=True),
                                   [F32]),
    "rope of fp32 q/k, fp32 stack": (lambda dev: lambda q, k: R.rope(q, k, *_cos_sin(dev), P, dtype=F32), [F32, F32]),
}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_gradients_equal_eager(name, dev):
    make, dtypes = CASES[name]
    fn = make(dev)
    g = torch.Generator().manual_seed(3)
    shape = (1, 2, 16, 64) if name.startswith("rope") else (16, 64)
    inputs = [torch.randn(*shape, generator=g).to(device=dev, dtype=d) for d in dtypes]
    eager, compiled = _grads(fn, inputs, False), _grads(fn, inputs, True)
    assert all(e is not None and bool(e.abs().sum() > 0) for e in eager), "the eager step must produce gradients"
    assert all(c is not None and torch.equal(c, e) for c, e in zip(compiled, eager)), name
