"""Which fp32 expression PyTorch's CUDA tanh-gelu computes: the evidence behind rla's GeGLU kernel.

``rla.ops._triton_geglu`` claims PyTorch's CUDA ``F.gelu(x, approximate='tanh')`` is
``0.5 * x * (1 + tanhf(b * fma(k, x*x*x, x)))``: nvcc contracting ``x + k * x_cube`` into one FMA,
``tanhf`` libdevice's. ``tests/ops/test_gated_triton.py`` checks the kernel's bits; if it fails,
this probe says which of the two assumptions broke. Every bf16 value (all 65,536 bit patterns, as
fp32) and 2**22 random fp32 values go through PyTorch's CUDA gelu and through candidate Triton
expressions, each step one IEEE operation (``enable_fp_fusion=False``):

- ``fma_libdevice``: the kernel's expression;
- ``nofma_libdevice``: ``x + k * x_cube`` as two roundings;
- ``fma_expform``: the FMA with tanh written as ``(1 - e) / (1 + e)``, ``e = expf(-2|y|)``;
- and ``torch.tanh`` against libdevice's ``tanh`` on the same arguments (the backward's tanh).

Writes one JSON (``--out``): per candidate and input set the fraction of bit-equal outputs and up
to 8 differing inputs with both values' bits. Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

BETA = 0.7978845608028654
KAPPA = 0.044715
CANDIDATES = {"fma_libdevice": (True, 0), "nofma_libdevice": (False, 0), "fma_expform": (True, 1)}


@triton.jit
def _gelu_kernel(x_ptr, o_ptr, n, FMA: tl.constexpr, TANH: tl.constexpr, BETA: tl.constexpr,
                 KAPPA: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    cube = x * x * x
    if FMA:
        s = tl.fma(KAPPA, cube, x)
    else:
        s = x + KAPPA * cube
    y = BETA * s
    if TANH == 0:
        t = libdevice.tanh(y)
    else:
        e = libdevice.exp(-2.0 * tl.abs(y))
        t = libdevice.div_rn(1.0 - e, 1.0 + e)
        t = tl.where(y < 0, -t, t)
    tl.store(o_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)


@triton.jit
def _tanh_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(o_ptr + offs, libdevice.tanh(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


def _launch(kernel, x, **flags):
    out = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024, enable_fp_fusion=False, **flags)
    return out


def _compare(got, want, x) -> dict:
    gb, wb = got.view(torch.int32), want.view(torch.int32)
    same = (gb == wb) | (torch.isnan(got) & torch.isnan(want))
    bad = (~same).nonzero().flatten()[:8].tolist()
    return {"n": x.numel(), "bit_equal": same.float().mean().item(), "differ": int((~same).sum()),
            "examples": [{"x": x[i].item(), "x_bits": hex(x.view(torch.int32)[i].item() & 0xFFFFFFFF),
                          "got_bits": hex(gb[i].item() & 0xFFFFFFFF), "want_bits": hex(wb[i].item() & 0xFFFFFFFF)}
                         for i in bad]}


def inputs() -> dict:
    every_bf16 = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(0)
    random = torch.randn(2**22, device="cuda", generator=gen) * 4
    return {"every_bf16": every_bf16.float(), "randn_x4_fp32": random}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gelu_probe_h200.py needs CUDA", file=sys.stderr)
        return 2
    results: dict = {}
    for name, x in inputs().items():
        want = F.gelu(x, approximate="tanh")
        for cand, (fma, tanh) in CANDIDATES.items():
            got = _launch(_gelu_kernel, x, FMA=fma, TANH=tanh, BETA=BETA, KAPPA=KAPPA)
            results[f"gelu/{cand}/{name}"] = _compare(got, want, x)
        y = BETA * (x + KAPPA * x * x * x)  # the backward's tanh argument, as the reference forms it
        results[f"tanh/libdevice_vs_torch/{name}"] = _compare(_launch(_tanh_kernel, y), torch.tanh(y), y)
    for key, r in results.items():
        print(f"{key:45s} bit-equal {r['bit_equal']:.6f}  ({r['differ']} of {r['n']} differ)")
    payload = {"stamp": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                         "triton": triton.__version__, "python": platform.python_version(),
                         "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         "command": " ".join(sys.argv)},
               "results": results}
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
