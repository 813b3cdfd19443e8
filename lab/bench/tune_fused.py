"""Launch-parameter sweep of the fused kernels at Qwen2.5-7B shapes (16384 tokens), H200.

Times the kernel launchers directly (no autograd), L2 flushed before each repetition, prints one
line per configuration and writes the fastest to ``--out`` (JSON: ``rla.ops.launch_config()`` keys -> value), which
``rla bench --config`` applies (``rla.ops.set_launch_config``). The defaults in ``rla/ops/_triton_*.py`` are the values
this sweep picked on the H200 (see results/). Usage: python lab/bench/tune_fused.py --out F
"""

import argparse
import json

import torch

from rla.bench.common import copy_bandwidth_gbs, time_ms
from rla.ops import _triton_norm, _triton_rope, _triton_swiglu, set_launch_config

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="tuned.json")
ap.add_argument("--only", nargs="*", default=["swiglu", "rope", "norm"])
args = ap.parse_args()
dev = torch.device("cuda")
lp = torch.bfloat16
T = 16384
bw = copy_bandwidth_gbs(dev)
print(f"copy bandwidth {bw:.0f} GB/s")
best: dict = {}


def sweep(name, module, configs, fn, nbytes):
    results = []
    kernel = module.__name__.rsplit("_", 1)[-1]  # _triton_swiglu -> swiglu: rla.ops.launch's keys
    for cfg in configs:
        set_launch_config({f"{kernel}.{k.lower()}": v for k, v in cfg.items()})
        try:
            ms = time_ms(lambda _: fn(), reps=15)
        except Exception as e:  # a configuration that does not compile is skipped
            print(f"{name:12s} {cfg} failed: {type(e).__name__}: {str(e)[:100]}")
            continue
        results.append((ms, cfg))
        print(f"{name:12s} {str(cfg):70s} {ms:.4f} ms {nbytes / ms / 1e6:6.0f} GB/s x{ms / (nbytes / bw / 1e6):.3f} of floor", flush=True)
    ms, cfg = min(results, key=lambda t: t[0])
    best.update({f"{kernel}.{k.lower()}": v for k, v in cfg.items()})
    set_launch_config(best)
    print(f"{name:12s} BEST {cfg} {ms:.4f} ms", flush=True)


if "swiglu" in args.only:
    g = torch.randn(T, 18944, device=dev, dtype=lp) * 2
    u = torch.randn_like(g)
    dy = torch.randn_like(g)
    n = g.numel()
    sweep("swiglu fwd", _triton_swiglu,
          [{"FWD_BLOCK": b, "FWD_WARPS": w} for b, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 8)]],
          lambda: _triton_swiglu.forward(g, u, False), 6 * n)
    sweep("swiglu bwd", _triton_swiglu,
          [{"BWD_BLOCK": b, "BWD_WARPS": w} for b, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 16)]],
          lambda: _triton_swiglu.backward(dy, g, u), 10 * n)
    del g, u, dy

if "rope" in args.only:
    q = torch.randn(4, 4096, 28, 128, device=dev, dtype=lp).transpose(1, 2)
    k = torch.randn(4, 4096, 4, 128, device=dev, dtype=lp).transpose(1, 2)
    cos = torch.randn(4, 4096, 128, device=dev)
    sin = torch.randn_like(cos)
    nb = 4 * (q.numel() + k.numel()) + 8 * cos.numel()
    def rope_fwd_bwd():
        _triton_rope.launch(q, k, cos, sin, True, False, False)
        _triton_rope.launch(q, k, cos, sin, True, False, True)

    sweep("rope fwd+bwd", _triton_rope,
          [{"TOKENS": t, "NUM_WARPS": w} for t in (1, 2, 4, 8) for w in (1, 2, 4, 8) if t * 4 >= w],
          rope_fwd_bwd, 2 * nb)
    del q, k, cos, sin

if "norm" in args.only:
    x = torch.randn(T, 3584, device=dev, dtype=lp)
    r = torch.randn_like(x)
    w = torch.randn(3584, device=dev, dtype=lp)
    n = x.numel()
    sweep("addnorm fwd", _triton_norm,
          [{"FWD_ROWS": rows, "FWD_WARPS": wp, "EVICT": ev}
           for rows in (1, 2, 4) for wp in (4, 8, 16, 32) for ev in ("evict_first", "")
           if rows * 4096 // (wp * 32) >= 8],
          lambda: _triton_norm.forward(x, r, w, 1e-6, False, True), 8 * n)
    _, _, rstd = _triton_norm.forward(x, r, w, 1e-6, False, True)
    dy, dres = torch.randn_like(x), torch.randn_like(x)
    cfgs = [{"BWD_ROWS": rows, "BWD_PROGRAMS_PER_SM": p, "BWD_WARPS": wp, "BWD_STAGES": 1}
            for rows in (1, 2, 4) for p in (4, 8, 16) for wp in (8, 16)]
    cfgs += [{"BWD_ROWS": 1, "BWD_PROGRAMS_PER_SM": p, "BWD_WARPS": wp, "BWD_STAGES": 2} for p in (4, 8) for wp in (8, 16)]
    sweep("addnorm bwd", _triton_norm, cfgs,
          lambda: _triton_norm.backward(dy, dres, x, r, w, rstd, True), 10 * n)

with open(args.out, "w") as f:
    json.dump(best, f, indent=1)
print("tuned:", json.dumps(best))
