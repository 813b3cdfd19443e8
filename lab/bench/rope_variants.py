"""Experiment: what keeps the RoPE kernel above its bandwidth floor, and what Liger's kernel costs
when it is handed the bf16 cos/sin a model gives it (no per-call cast).

GPU time only (each body captured in a CUDA graph, L2 flushed before every replay), Qwen2.5-7B
shapes (4 x 4096 tokens, 28 q heads, 4 kv heads, head dim 128), forward and forward + backward
launches without autograd. Arms:

  copy           ``out.copy_(q)``, ``out.copy_(k)``: the same q/k bytes, no tables (practical floor)
  rla            ``_triton_rope.launch`` (the shipped kernel), tables fp32 full / fp32 half / bf16 half
  loads-first    the shipped kernel's arithmetic with every q and k load issued before any store
                 (in the shipped kernel the k loads follow the q stores, which may alias them)
  swap           one contiguous load of each head row plus a second load of the same row with its
                 halves swapped (an L1/L2 hit), one contiguous store
  liger          Liger's ``rope_forward`` / ``rope_backward`` (in place) on bf16 full tables

The variants are checked bit for bit against the shipped kernel (forward and backward, vllm
profile: rounded cos/sin, one rounding) before they are timed.
Usage: python lab/bench/rope_variants.py --out F.json
"""

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from rla.bench.common import copy_bandwidth_gbs, time_reps_ms
from rla.environment import environment
from rla.bench.ops import _graph_ms
from rla.ops import _triton_rope
from rla.ops._triton_common import LAUNCH_OPTS


@triton.jit
def _loads_first_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, S, sqb, sqh, sqs, skb, skh, sks, scb, scs,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr, HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    lp: tl.constexpr = oq_ptr.dtype.element_ty
    d = tl.arange(0, HALF)[None, :]
    c = tl.load(cos_ptr + b * scb + s * scs + d).to(tl.float32).to(lp).to(tl.float32)
    sn = tl.load(sin_ptr + b * scb + s * scs + d).to(tl.float32).to(lp).to(tl.float32)
    hq = tl.arange(0, HQ_P)[:, None]
    hk = tl.arange(0, HK_P)[:, None]
    mq = (hq < HQ) & (d < HALF)
    mk = (hk < HK) & (d < HALF)
    oq = b * sqb + s * sqs + hq * sqh + d
    ok = b * skb + s * sks + hk * skh + d
    q1 = tl.load(q_ptr + oq, mask=mq, other=0.0).to(tl.float32)
    k1 = tl.load(k_ptr + ok, mask=mk, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptr + oq + HALF, mask=mq, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + ok + HALF, mask=mk, other=0.0).to(tl.float32)
    if BACKWARD:
        tl.store(oq_ptr + oq, (q1 * c + q2 * sn).to(lp), mask=mq)
        tl.store(oq_ptr + oq + HALF, (q2 * c - q1 * sn).to(lp), mask=mq)
        tl.store(ok_ptr + ok, (k1 * c + k2 * sn).to(lp), mask=mk)
        tl.store(ok_ptr + ok + HALF, (k2 * c - k1 * sn).to(lp), mask=mk)
    else:
        tl.store(oq_ptr + oq, (q1 * c - q2 * sn).to(lp), mask=mq)
        tl.store(oq_ptr + oq + HALF, (q2 * c + q1 * sn).to(lp), mask=mq)
        tl.store(ok_ptr + ok, (k1 * c - k2 * sn).to(lp), mask=mk)
        tl.store(ok_ptr + ok + HALF, (k2 * c + k1 * sn).to(lp), mask=mk)


@triton.jit
def _swap_heads(x_ptr, o_ptr, base, sh, c, sn, H: tl.constexpr, H_P: tl.constexpr,
                D: tl.constexpr, HALF: tl.constexpr, BACKWARD: tl.constexpr):
    lp: tl.constexpr = o_ptr.dtype.element_ty
    h = tl.arange(0, H_P)[:, None]
    d = tl.arange(0, D)[None, :]
    m = (h < H) & (d < D)
    x = tl.load(x_ptr + base + h * sh + d, mask=m, other=0.0).to(tl.float32)
    xs = tl.load(x_ptr + base + h * sh + (d ^ HALF), mask=m, other=0.0).to(tl.float32)
    xc = x * c
    p = xs * sn
    first = d < HALF
    if BACKWARD:
        o = tl.where(first, xc + p, xc - p)
    else:
        o = tl.where(first, xc - p, xc + p)
    tl.store(o_ptr + base + h * sh + d, o.to(lp), mask=m)


@triton.jit
def _swap_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, S, sqb, sqh, sqs, skb, skh, sks, scb, scs,
    HQ: tl.constexpr, HK: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr, HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    lp: tl.constexpr = oq_ptr.dtype.element_ty
    D: tl.constexpr = 2 * HALF
    d = tl.arange(0, D)[None, :]
    row = b * scb + s * scs + d % HALF  # half table: column j and j + HALF hold the same value
    c = tl.load(cos_ptr + row).to(tl.float32).to(lp).to(tl.float32)
    sn = tl.load(sin_ptr + row).to(tl.float32).to(lp).to(tl.float32)
    _swap_heads(q_ptr, oq_ptr, b * sqb + s * sqs, sqh, c, sn, HQ, HQ_P, D, HALF, BACKWARD)
    _swap_heads(k_ptr, ok_ptr, b * skb + s * sks, skh, c, sn, HK, HK_P, D, HALF, BACKWARD)


def variant_launch(kernel, warps):
    def launch(q, k, cos, sin, backward):
        oq, ok = torch.empty_like(q), torch.empty_like(k)
        B, HQ, S, D = q.shape
        HK = k.shape[1]
        assert cos.shape[-1] == D // 2 and cos.is_contiguous()
        qs, ks = q.stride(), k.stride()
        kernel[(B * S,)](
            q, k, cos, sin, oq, ok, S, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], cos.stride(0), cos.stride(1),
            HQ=HQ, HK=HK, HQ_P=triton.next_power_of_2(HQ), HK_P=triton.next_power_of_2(HK), HALF=D // 2,
            BACKWARD=backward, num_warps=warps, **LAUNCH_OPTS,
        )
        return oq, ok

    return launch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    lp = torch.bfloat16
    B, S, HQ, HK, D = 4, 4096, 28, 4, 128
    q = torch.randn(B, S, HQ, D, device=dev, dtype=lp).transpose(1, 2)
    k = torch.randn(B, S, HK, D, device=dev, dtype=lp).transpose(1, 2)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    pos = torch.arange(S, device=dev, dtype=torch.float32)
    freqs = torch.outer(pos, inv)[None].expand(B, S, D // 2)
    half32 = (freqs.cos().contiguous(), freqs.sin().contiguous())
    full32 = tuple(torch.cat((t, t), -1).contiguous() for t in half32)
    half16 = tuple(t.to(lp) for t in half32)
    full16 = tuple(t.to(lp) for t in full32)
    bw = copy_bandwidth_gbs(dev)
    qk_bytes = 2 * 2 * (q.numel() + k.numel())  # read + write

    def rla(tables):
        return lambda bwd: _triton_rope.launch(q, k, *tables, True, False, bwd)

    arms = {
        "rla fp32 full": (rla(full32), full32),
        "rla fp32 half": (rla(half32), half32),
        "rla bf16 half": (rla(half16), half16),
    }
    for w in (4, 8):
        for name, kern in (("loads-first", _loads_first_kernel), ("swap", _swap_kernel)):
            for tname, tables in (("fp32 half", half32), ("bf16 half", half16)):
                launch = variant_launch(kern, w)
                arms[f"{name} {tname} w{w}"] = ((lambda l, t: lambda bwd: l(q, k, *t, bwd))(launch, tables), tables)

    rows, checks = [], {}
    ref = {bwd: _triton_rope.launch(q, k, *full32, True, False, bwd) for bwd in (False, True)}
    for name, (fn, _) in arms.items():
        checks[name] = all(torch.equal(a, b) for bwd in (False, True) for a, b in zip(fn(bwd), ref[bwd]))
    oq, ok = torch.empty_like(q), torch.empty_like(k)

    def copy_body():
        oq.copy_(q)
        ok.copy_(k)

    timed = {"copy": (copy_body, lambda: (copy_body(), copy_body()), 0)}
    for name, (fn, tables) in arms.items():
        timed[name] = (lambda f=fn: f(False), lambda f=fn: (f(False), f(True)), tables[0].numel() * tables[0].element_size() * 2)
    try:
        from liger_kernel.ops.rope import rope_backward, rope_forward

        ql, kl = q.clone(), k.clone()
        timed["liger bf16 full"] = (
            lambda: rope_forward(ql, kl, *full16),
            lambda: (rope_forward(ql, kl, *full16), rope_backward(ql, kl, *full16)),
            full16[0].numel() * 2,  # Liger reads the first half of each table
        )
        timed["liger bf16 full, per-call cast from fp32"] = (
            lambda: rope_forward(ql, kl, full32[0].to(lp), full32[1].to(lp)),
            lambda: (rope_forward(ql, kl, full32[0].to(lp), full32[1].to(lp)), rope_backward(ql, kl, *full16)),
            full16[0].numel() * 2 + 2 * full32[0].numel() * 6,
        )
    except ImportError as e:
        print("liger not importable:", e)
    for name, (fwd, fwd_bwd, table_bytes) in timed.items():
        f_ms = statistics.median([_graph_ms(fwd, args.reps, dev) for _ in range(3)])
        fb_ms = statistics.median([_graph_ms(fwd_bwd, args.reps, dev) for _ in range(3)])
        floor_ms = (qk_bytes + table_bytes) / bw / 1e6
        rows.append({"arm": name, "fwd_ms": f_ms, "fwd_bwd_ms": fb_ms, "fwd_floor_ms": floor_ms,
                     "fwd_over_floor": f_ms / floor_ms, "bitwise_vs_shipped": checks.get(name)})
        print(f"{name:45s} fwd {f_ms:.4f} ms ({f_ms / floor_ms:.3f}x floor)  fwd+bwd {fb_ms:.4f} ms"
              f"  bitwise {checks.get(name)}", flush=True)
    eager = {}
    for name in ("rla fp32 full", "rla fp32 half", "loads-first fp32 half w4", "swap fp32 half w4"):
        fn = arms[name][0]
        eager[name] = statistics.median(time_reps_ms(lambda _: (fn(False), fn(True)), reps=args.reps, device=dev))
    out = {"env": environment(dev), "copy_gbs": bw, "shape": [B, S, HQ, HK, D], "rows": rows,
           "eager_launch_fwd_bwd_ms": eager,
           "command": "python lab/bench/rope_variants.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items())}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
