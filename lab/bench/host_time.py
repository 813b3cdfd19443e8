"""Host time of one aligned op call, layer by layer, next to Liger's (GPU).

The per-op benchmark times single calls, so for RoPE and add+RMSNorm (kernels of ~70-120 us at
16K tokens) its eager numbers are mostly Python: wrappers, autograd, allocations, Triton's
launcher. This script splits that time into the layers a call goes through. Each row is the mean
over many calls on tiny inputs (the GPU never waits on itself), synchronised once at the end:

  kernel launch   the Triton kernel alone, with the arguments one real call passed (recorded)
  launcher        rla.ops._triton_*: allocations, strides, the launch
  fused op        rla.ops.fused: layout checks, autograd.Function, the launcher
  rla.ops         the public op: profile lookup, input checks, backend choice, the fused op
  liger           Liger Kernel's op, for comparison (when importable)
  floors          an empty autograd.Function, one ``torch.empty_like``, for scale

forward = one call without grad; fwd+bwd = a call with grad and ``torch.autograd.grad``.

    python lab/bench/host_time.py --out host.json [--label new]
Run it once per code version (PYTHONPATH) in the same device call to compare versions.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rla.environment import environment

DEV = torch.device("cuda")
LP = torch.bfloat16


def per_call_us(fn, n: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


class _Recorder:
    """Stands in for a Triton kernel object: launches it and keeps the last call's arguments."""

    def __init__(self, kernel):
        self.kernel, self.call = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.call = (grid, args, kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


def recorded_launch(module, name: str, call):
    """Run ``call()`` with ``module.name`` recorded; -> a function relaunching that kernel."""
    kernel = getattr(module, name)
    rec = _Recorder(kernel)
    setattr(module, name, rec)
    try:
        call()
    finally:
        setattr(module, name, kernel)
    grid, args, kwargs = rec.call
    return lambda: kernel[grid](*args, **kwargs)


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def fwd_bwd(fn, leaves, ups):
    def run():
        outs = fn(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.grad(outs, leaves, ups[: len(outs)])

    return run


def rope_rows(n):
    from rla import ops, profiles
    from rla.ops import _triton_rope, fused

    B, S, HQ, HK, D = 1, 64, 4, 2, 64
    q = torch.randn(B, S, HQ, D, device=DEV, dtype=LP).transpose(1, 2)
    k = torch.randn(B, S, HK, D, device=DEV, dtype=LP).transpose(1, 2)
    emb = torch.randn(1, S, D, device=DEV)
    cos, sin = emb.cos(), emb.sin()
    prof = profiles.get("vllm")
    ql, kl = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    ups = (torch.randn_like(q), torch.randn_like(k))
    cos_b, sin_b = cos.expand(B, S, D), sin.expand(B, S, D)
    rows = {
        "kernel launch": recorded_launch(_triton_rope, "_rope_kernel",
                                         lambda: _triton_rope.launch(q, k, cos_b, sin_b, True, False, False)),
        "launcher": lambda: _triton_rope.launch(q, k, cos_b, sin_b, True, False, False),
    }
    with torch.no_grad():
        rows["fused op"] = lambda: fused.rope(q, k, cos, sin, prof)
        rows["rla.ops"] = lambda: ops.rope(q, k, cos, sin, "vllm")
    out = {}
    for name, fn in rows.items():
        with torch.no_grad():
            out[name] = {"fwd": per_call_us(fn, n)}
    out["fused op"]["fwd_bwd"] = per_call_us(fwd_bwd(lambda a, b: fused.rope(a, b, cos, sin, prof), (ql, kl), ups), n)
    out["rla.ops"]["fwd_bwd"] = per_call_us(fwd_bwd(lambda a, b: ops.rope(a, b, cos, sin, "vllm"), (ql, kl), ups), n)
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        cl, sl = cos.to(LP), sin.to(LP)  # Liger takes lp cos/sin; the cast is not counted
        with torch.no_grad():
            f = per_call_us(lambda: LigerRopeFunction.apply(q, k, cl, sl), n)
        qc, kc = ql.detach().clone().requires_grad_(True), kl.detach().clone().requires_grad_(True)
        # Liger rotates in place; on a leaf that needs grad, rotate a view of it
        fb = per_call_us(fwd_bwd(lambda a, b: LigerRopeFunction.apply(a * 1, b * 1, cl, sl), (qc, kc), ups), n)
        out["liger"] = {"fwd": f, "fwd_bwd": fb, "note": "fwd+bwd includes two copies (in-place op on leaves)"}
    except ImportError as e:
        out["liger"] = {"error": str(e)}
    return out


def norm_rows(n):
    from rla import ops, profiles
    from rla.ops import _triton_norm, fused

    M, N = 64, 256
    x = torch.randn(M, N, device=DEV, dtype=LP)
    r = torch.randn(M, N, device=DEV, dtype=LP)
    w = torch.rand(N, device=DEV, dtype=LP) + 0.5
    prof = profiles.get("vllm")
    leaves = tuple(t.detach().requires_grad_(True) for t in (x, r, w))
    ups = (torch.randn_like(x), torch.randn_like(x))
    y, res, rstd = _triton_norm.forward(x, r, w, 1e-6, False, True)
    rows = {
        "kernel launch": recorded_launch(_triton_norm, "_norm_fwd_kernel",
                                         lambda: _triton_norm.forward(x, r, w, 1e-6, False, True)),
        "launcher": lambda: _triton_norm.forward(x, r, w, 1e-6, False, True),
        "fused op": lambda: fused.add_rms_norm(x, r, w, 1e-6, prof),
        "rla.ops": lambda: ops.add_rms_norm(x, r, w, 1e-6, "vllm"),
    }
    out = {}
    for name, fn in rows.items():
        with torch.no_grad():
            out[name] = {"fwd": per_call_us(fn, n)}
    bwd_launch = recorded_launch(_triton_norm, "_norm_bwd_kernel",
                                 lambda: _triton_norm.backward(ups[0], ups[1], x, r, w, rstd, True))
    out["kernel launch"]["bwd"] = per_call_us(bwd_launch, n)
    out["launcher"]["bwd"] = per_call_us(lambda: _triton_norm.backward(ups[0], ups[1], x, r, w, rstd, True), n)
    out["fused op"]["fwd_bwd"] = per_call_us(fwd_bwd(lambda *a: fused.add_rms_norm(*a, 1e-6, prof), leaves, ups), n)
    out["rla.ops"]["fwd_bwd"] = per_call_us(fwd_bwd(lambda *a: ops.add_rms_norm(*a, 1e-6, "vllm"), leaves, ups), n)
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        def liger(a, b, c):
            return LigerFusedAddRMSNormFunction.apply(a, b, c, 1e-6, 0.0, "llama", False)

        with torch.no_grad():
            f = per_call_us(lambda: liger(x, r, w), n)
        out["liger"] = {"fwd": f, "fwd_bwd": per_call_us(fwd_bwd(liger, leaves, ups), n)}
    except ImportError as e:
        out["liger"] = {"error": str(e)}
    return out


def floors(n):
    x = torch.randn(64, device=DEV)
    xl = x.detach().requires_grad_(True)
    g = torch.randn_like(x)
    return {
        "empty autograd.Function": {"fwd": per_call_us(lambda: _Noop.apply(xl), n),
                                    "fwd_bwd": per_call_us(fwd_bwd(_Noop.apply, (xl,), (g,)), n)},
        "torch.empty_like": {"fwd": per_call_us(lambda: torch.empty_like(x), n)},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("-n", type=int, default=500, help="calls per row")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each row reports the minimum")
    a = ap.parse_args()
    rounds = [{"rope": rope_rows(a.n), "add_rms_norm": norm_rows(a.n), "floors": floors(a.n)}
              for _ in range(a.repeat)]
    best = {}
    for op, rows in rounds[0].items():
        best[op] = {}
        for name, vals in rows.items():
            best[op][name] = {k: (min(r[op][name][k] for r in rounds) if isinstance(v, float) else v)
                              for k, v in vals.items()}
    payload = {"label": a.label, "env": environment(DEV), "calls_per_row": a.n, "rounds": a.repeat,
               "us_per_call_min_over_rounds": best, "rounds_raw": rounds}
    with open(a.out, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"host us per call ({a.label}; min of {a.repeat} rounds of {a.n} calls)")
    for op, rows in best.items():
        for name, vals in rows.items():
            print(f"  {op:13s} {name:24s} " + "  ".join(
                f"{k} {v:7.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in vals.items()))


if __name__ == "__main__":
    main()
