"""Time the q/k norm backward kernels at a Qwen3-1.7B q/k shape under three backward tiles (issue #36).

Tiles, set through the launch keys (``rla.ops.set_launch_config``) before each timing:
  one-row   ``norm.narrow_cols=1``: head-dim rows on the wide tile (``BWD_ROWS`` = 1 row, 8
            warps), what every width took before the narrow tile
  narrow    the defaults: 32 * 8 / head_dim rows of 8 warps, one element per thread, the fused
            kernel two tiles per loop step (d_x bit for bit the one-row tile's)
  tall      ``norm.narrow_cols=1, norm.bwd_rows=32``: 32 rows of 8 warps, eight elements per
            thread (16-byte loads; another row layout, so d_x may differ from the others by
            the order of a row's sum); only a measurement of what that order would buy
Kernels: the fused q/k norm + RoPE backward (``_triton_qk_norm_rope.backward``, the ``vllm`` row's)
and the plain norm backward on the same q and k rows (``_triton_norm.backward``, the chain's).
Prints ms per call and per step (x layers), and whether each tile's d_q / d_k equal the one-row
tile's. CUDA events on a GPU; on a CPU (``TRITON_INTERPRET=1``, small ``--tokens``) it only runs.

  python lab/bench/qk_bwd_tiles.py [--tokens 8192] [--head-dim 128] [--layers 28] [--reps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from rla.ops import launch_config, set_launch_config
from rla.ops import _triton_norm as N
from rla.ops import _triton_qk_norm_rope as F
from rla.ops import _triton_rope as R

TILES = {"one-row": {"norm.narrow_cols": 1}, "narrow": {}, "tall": {"norm.narrow_cols": 1, "norm.bwd_rows": 32}}


def inputs(tokens, hq, hk, d, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    q = (torch.randn(1, tokens, hq, d, device=dev, generator=g) * 4).bfloat16().transpose(1, 2)
    k = (torch.randn(1, tokens, hk, d, device=dev, generator=g) * 4).bfloat16().transpose(1, 2)
    wq, wk = (torch.rand(d, device=dev, generator=g) + 0.5).bfloat16(), (torch.rand(d, device=dev) + 0.5).bfloat16()
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    emb = torch.cat([torch.outer(torch.arange(tokens, device=dev, dtype=torch.float32), inv)] * 2, -1)[None]
    cos, sin = emb.cos().bfloat16().contiguous(), emb.sin().bfloat16().contiguous()
    gq = torch.randn(1, hq, tokens, d, device=dev, generator=g).bfloat16()
    gk = torch.randn(1, hk, tokens, d, device=dev, generator=g).bfloat16()
    _, _, rq, rk = F.forward(q, k, wq, wk, 1e-6, 1e-6, cos, sin, True, False, False, "unpinned", 1)
    dyq, dyk = R.launch(gq, gk, cos, sin, True, False, True, 1, torch.float32)
    return q, k, wq, wk, cos, sin, rq, rk, gq, gk, dyq, dyk


def timed(fn, reps, dev):
    fn()
    if dev == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            out = fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps, out
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    return (time.perf_counter() - t) * 1e3 / reps, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--q-heads", type=int, default=16)
    p.add_argument("--k-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, wq, wk, cos, sin, rq, rk, gq, gk, dyq, dyk = inputs(a.tokens, a.q_heads, a.k_heads, a.head_dim, dev)

    def fused():
        return F.backward(gq, gk, q, k, wq, wk, cos, sin, rq, rk, True, 1, True, True)

    def plain():
        return [N.backward(dy.transpose(1, 2), None, x.transpose(1, 2), None, w, r.view(x.shape[0], -1, x.shape[1]),
                           True, torch.bfloat16)[0] for dy, x, w, r in ((dyq, q, wq, rq), (dyk, k, wk, rk))]

    before = launch_config()
    ref = {}
    try:
        for name, tile in TILES.items():
            set_launch_config(before)
            set_launch_config(tile)
            tq = N.backward_tile(q.numel() // a.head_dim, a.head_dim)
            for kernel, fn in (("fused q/k norm+rope bwd", fused), ("norm bwd (q and k)", plain)):
                ms, out = timed(fn, a.reps, dev)
                dx = [o.contiguous() for o in out[:2]]
                ref.setdefault(kernel, dx)
                same = all(torch.equal(x, y) for x, y in zip(dx, ref[kernel]))
                print(f"{name:8s} rows/warps/unroll {tq}  {kernel:24s} {ms:8.3f} ms/call  "
                      f"{ms * a.layers:8.2f} ms/step  d_x {'==' if same else '!='} one-row")
    finally:
        set_launch_config(before)


if __name__ == "__main__":
    main()
