"""Where SGLang 0.5.23's JIT SwiGLU and RoPE kernels differ from the calibrated choice (the last-bit
rest of `rla calibrate --engine sglang`), and which arithmetic explains it. One H200 call.

SwiGLU: SGLang builds ActivationKernel with --use_fast_math (silu = x / (1 + __expf(-x)) with a fast
division). RoPE: FusedRopeKernel computes x*cos - y*sin in fp32, where nvcc contracts to an FMA.
For each kernel output that differs from rla's `fused` choice, this checks candidate expressions.
"""
import json
import sys

import torch
import torch.nn.functional as F

from rla.engines import sglang

BF = torch.bfloat16
out = {}
eng = sglang.load(sys.argv[1])
k = eng.kernels()
k.build()
g = torch.Generator(device="cuda").manual_seed(0)

# -- SwiGLU ---------------------------------------------------------------------------------------
rows, d = 4096, 4096
scales = [1.0, 4.0, 16.0, 64.0]
sw = {"elements": 0, "differ": 0, "differ_gate_below_-80": 0, "differ_ref_tiny": 0, "differ_1ulp": 0,
      "equal_with_ftz_and_fast_division_model": 0, "examples": []}
for s in scales:
    x = (torch.randn(rows, 2 * d, generator=g, device="cuda") * s).to(BF)
    gate, up = x[:, :d].float(), x[:, d:].float()
    got = k.silu_and_mul(x)
    ref = (F.silu(gate) * up).to(BF)
    den = 1.0 + torch.exp(-gate)
    model = torch.where(den > 2.0**126, torch.zeros_like(gate), gate / den) * up  # __fdividef returns 0 there
    model = model.to(BF)
    diff = got != ref
    sw["elements"] += got.numel()
    sw["differ"] += int(diff.sum())
    sw["differ_gate_below_-80"] += int((diff & (gate < -80)).sum())
    sw["differ_ref_tiny"] += int((diff & (ref.float().abs() < 1e-30)).sum())
    ulp = (got.view(torch.int16).int() - ref.view(torch.int16).int()).abs()
    sw["differ_1ulp"] += int((diff & (ulp == 1)).sum())
    sw["equal_with_ftz_and_fast_division_model"] += int((diff & (got == model)).sum())
    idx = diff.nonzero()[:3]
    for r, c in idx.tolist():
        sw["examples"].append({"scale": s, "gate": gate[r, c].item(), "up": up[r, c].item(),
                               "kernel": got[r, c].item(), "fused_choice": ref[r, c].item()})
out["swiglu"] = sw
print("swiglu", {kk: v for kk, v in sw.items() if kk != "examples"}, flush=True)

# -- RoPE -----------------------------------------------------------------------------------------
t, heads, hd = 8192, 16, 128
cache = eng.rope_cache(hd, hd, 32768, 1e6, None, BF, "cuda")
pos = torch.randint(0, 32768, (t,), generator=g, device="cuda")
q = torch.randn(t, heads * hd, generator=g, device="cuda").to(BF)
kk_ = torch.randn(t, 2 * hd, generator=g, device="cuda").to(BF)
qo, ko = k.rope(pos, q, kk_, hd, cache)
cs = cache[pos].float()
cos, sin = cs[:, None, : hd // 2], cs[:, None, hd // 2 :]
x = q.view(t, heads, hd).float()
x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
got = qo.view(t, heads, hd)
cands = {
    "fp32_two_products": torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1),
    "fp64_exact": torch.cat((x1.double() * cos.double() - x2.double() * sin.double(),
                             x2.double() * cos.double() + x1.double() * sin.double()), -1),
    "fma_first_product_exact": torch.cat(((x1.double() * cos.double() - (x2 * sin).double()).float(),
                                          (x2.double() * cos.double() + (x1 * sin).double()).float()), -1),
    "fma_second_product_exact": torch.cat((((x1 * cos).double() - x2.double() * sin.double()).float(),
                                           ((x2 * cos).double() + x1.double() * sin.double()).float()), -1),
}
ref = cands["fp32_two_products"].to(BF)
diff = got != ref
ro = {"elements": got.numel(), "differ_from_fused_choice": int(diff.sum())}
for name, c in cands.items():
    cb = c.to(torch.float32).to(BF) if c.dtype == torch.float64 else c.to(BF)
    ro[f"equal_everywhere_{name}"] = float((got == cb).double().mean())
    ro[f"of_the_rest_equal_{name}"] = int((diff & (got == cb)).sum())
ratio = (got.float() - ref.float()).abs()[diff] / x.abs().amax(-1, keepdim=True).expand_as(x)[diff]
ro["rest_abs_diff_over_row_max_max"] = float(ratio.max()) if diff.any() else 0.0
out["rope"] = ro
print("rope", ro, flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=2)
