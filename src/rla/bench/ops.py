"""Per-op benchmark: each region under every implementation, side by side in one run.

Implementations (bf16, Qwen2.5-7B shapes by default, 16384 tokens):
  hf       HF eager as the model runs it: ``act_fn(gate) * up``; ``residual + h`` then
           ``Qwen2RMSNorm``; ``apply_rotary_pos_emb`` with bf16 cos/sin
  naive    the aligned (vllm profile) numbers by eager fp32 upcasts: every intermediate an fp32
           tensor in memory
  compile  ``torch.compile`` of the naive expression (Inductor fuses it)
  liger    Liger Kernel's ops (when importable): ``LigerSiLUMulFunction``,
           ``LigerFusedAddRMSNormFunction``, ``LigerRopeFunction`` (in place on q/k)
  rla      ``rla.ops`` (fused Triton path) under the ``vllm`` profile; RoPE also under ``sglang``
           (fp32 cos/sin)

Measured: forward, backward (forward untimed), forward+backward (median ms), peak memory above
the inputs during forward+backward, achieved GB/s over a minimal byte count, and the
bandwidth floor = minimal bytes / copy bandwidth measured in the same run. Minimal bytes (lp =
2 B): swiglu fwd 3n lp, bwd 5n (gate, up, dy read; d_gate, d_up written); add+rmsnorm fwd 4n
(x, r read; y, new residual written), bwd 5n (dy, d_residual, x, r read; d_x written once, as
autograd hands the same tensor to x and r); rope fwd and bwd 2 (n_q + n_k) plus the fp32 half
cos/sin rows rla reads (``rope_case`` says which tables each implementation gets).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from rla.bench.common import copy_bandwidth_gbs, time_ms, write_results
from rla.environment import env_markdown, environment
from rla.ops import set_launch_config
from rla.profiles import resolve

LP = torch.bfloat16
EPS = 1e-6


@dataclass
class Case:
    name: str
    shape: str
    make: Callable[[torch.device], dict]  # -> {"inputs": tuple, "grad_outputs": tuple, ...}
    bytes_fwd: int
    bytes_bwd: int
    impls: dict[str, Callable] = field(default_factory=dict)
    prepare: dict[str, Callable] = field(default_factory=dict)  # per-impl fresh inputs (in-place ops)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _rot(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# ---- naive fp32 expressions of the vllm profile (also what torch.compile is given) ----------


def naive_swiglu(g, u):
    return (F.silu(g.float()) * u.float()).to(g.dtype)


def naive_rms_norm(x, w, eps=EPS, lp=None):
    """RMSNorm of ``x`` (an fp32 ``x`` with ``lp`` bf16: a residual sum read in fp32), rounded to ``lp``."""
    lp = x.dtype if lp is None else lp
    v = x.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.to(lp).float()).to(lp)


def naive_add_rms_norm(x, r, w, eps=EPS):
    s = x.float() + r.float()  # the norm reads the fp32 sum (fp32_sum); RN(s) is the new residual
    return naive_rms_norm(s, w, eps, x.dtype), s.to(x.dtype)


def naive_rope(q, k, cos, sin, unsqueeze_dim=1):
    c = cos.to(q.dtype).float().unsqueeze(unsqueeze_dim)
    s = sin.to(q.dtype).float().unsqueeze(unsqueeze_dim)
    qf, kf = q.float(), k.float()
    return (qf * c + _rot(qf) * s).to(q.dtype), (kf * c + _rot(kf) * s).to(k.dtype)


#: The points the naive expressions above compute: the vllm profile's (rope_inv_freq and the
#: residual stream are the aligned modules' business, not the ops').
NAIVE_POINTS = ("rope_cos_sin", "rope_apply", "swiglu", "norm_weight", "norm_residual")


class NaiveUpcastOps:
    """The naive expressions above as the ``ops`` of :func:`rla.alignment.align`: the e2e
    benchmark's ``naive-upcast`` arm is ``align(model, "vllm", ops=NAIVE_UPCAST)``.

    What a team would write by hand: plain eager fp32 upcasts that autograd differentiates, every
    fp32 intermediate kept for backward. The forward computes the vllm profile's numbers (the
    same as ``rla.ops`` on the CPU, bit for bit); any profile that rounds elsewhere at these ops'
    points is refused, and so are fp32 q/k handed to RoPE (``qk_norm_out='fp32'`` chains).
    """

    name = "naive fp32 upcasts (rla.bench.ops.NAIVE_UPCAST)"

    def _check(self, profile):
        want = resolve("vllm")
        if [getattr(profile, p) for p in NAIVE_POINTS] != [getattr(want, p) for p in NAIVE_POINTS]:
            diff = {p: (getattr(profile, p), getattr(want, p)) for p in NAIVE_POINTS if getattr(profile, p) != getattr(want, p)}
            raise ValueError(f"{self.name} compute the vllm profile's points; {profile.name!r} differs (its, vllm's): {diff}")

    def rope(self, q, k, cos, sin, profile, unsqueeze_dim=1, dtype=None):
        self._check(profile)
        if dtype not in (None, q.dtype):
            raise NotImplementedError(f"{self.name}: q/k in {q.dtype} with stack dtype {dtype} (a q/k-norm chain)")
        if cos.shape[-1] != q.shape[-1]:  # half tables [..., D/2], as rla.align's rotary returns them
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        return naive_rope(q, k, cos, sin, unsqueeze_dim)

    def swiglu(self, gate, up, profile):
        self._check(profile)
        return naive_swiglu(gate, up)

    def rms_norm(self, x, weight, eps, profile, dtype=None, out_dtype=None):
        self._check(profile)
        if out_dtype not in (None, dtype or x.dtype):
            raise NotImplementedError(f"{self.name}: an unrounded ({out_dtype}) norm output (a q/k-norm chain)")
        return naive_rms_norm(x, weight, eps, dtype)

    def add_rms_norm(self, x, residual, weight, eps, profile):
        self._check(profile)
        return naive_add_rms_norm(x, residual, weight, eps)


NAIVE_UPCAST = NaiveUpcastOps()


# ---- cases ---------------------------------------------------------------------------------


def swiglu_case(tokens: int, inter: int) -> Case:
    n = tokens * inter

    def make(dev):
        g = torch.randn(tokens, inter, device=dev, dtype=LP) * 2
        u = torch.randn(tokens, inter, device=dev, dtype=LP)
        return {"inputs": (_leaf(g), _leaf(u)), "grad_outputs": (torch.randn_like(g),)}

    case = Case("swiglu", f"{tokens} x {inter}", make, 3 * 2 * n, 5 * 2 * n)
    case.impls["hf"] = lambda g, u: (F.silu(g) * u,)
    case.impls["naive"] = lambda g, u: (naive_swiglu(g, u),)
    compiled = torch.compile(naive_swiglu, dynamic=False)
    case.impls["compile"] = lambda g, u: (compiled(g, u),)
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        case.impls["liger"] = lambda g, u: (LigerSiLUMulFunction.apply(g, u),)
    except Exception:
        pass
    from rla import ops

    case.impls["rla"] = lambda g, u: (ops.swiglu(g, u, "vllm"),)
    return case


def add_rms_norm_case(tokens: int, hidden: int) -> Case:
    n = tokens * hidden

    def make(dev):
        x = torch.randn(tokens, hidden, device=dev, dtype=LP)
        r = torch.randn(tokens, hidden, device=dev, dtype=LP) * 4
        w = 1 + 0.1 * torch.randn(hidden, device=dev, dtype=LP)
        return {
            "inputs": (_leaf(x), _leaf(r), _leaf(w)),
            "grad_outputs": (torch.randn_like(x), torch.randn_like(x)),
        }

    case = Case("add_rms_norm", f"{tokens} x {hidden}", make, 4 * 2 * n, 5 * 2 * n)

    def hf(x, r, w):
        # the decoder layer's ``residual + hidden``, then Qwen2RMSNorm.forward inlined
        h = r + x
        hs = h.to(torch.float32)
        var = hs.pow(2).mean(-1, keepdim=True)
        hs = hs * torch.rsqrt(var + EPS)
        return w * hs.to(h.dtype), h

    case.impls["hf"] = hf
    case.impls["naive"] = naive_add_rms_norm
    compiled = torch.compile(naive_add_rms_norm, dynamic=False)
    case.impls["compile"] = compiled
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        case.impls["liger"] = lambda x, r, w: LigerFusedAddRMSNormFunction.apply(
            x, r, w, EPS, 0.0, "llama", False
        )
    except Exception:
        pass
    from rla import ops

    case.impls["rla"] = lambda x, r, w: ops.add_rms_norm(x, r, w, EPS, "vllm")
    return case


_TABLE_AT = {"half": 0, "full": 2, "lp": 4}


def _tables(which: str, fn: Callable) -> Callable:
    """``fn(q, k, cos, sin)`` fed the ``which`` pair of rope_case's consts: fp32 half tables, fp32
    full tables or bf16 full tables."""
    i = _TABLE_AT[which]
    return lambda q, k, *tables: fn(q, k, tables[i], tables[i + 1])


def rope_case(batch: int, seq: int, hq: int, hk: int, dim: int) -> Case:
    """Each implementation gets the cos/sin a model gives it once per forward, not a per-call cast:
    HF eager and Liger HF's rotary output (bf16, [B, S, D]); rla what ``rla.align``'s rotary
    returns (fp32 half tables, [B, S, D/2]); the naive and compiled expressions fp32 [B, S, D]."""
    nq, nk = batch * seq * hq * dim, batch * seq * hk * dim

    def make(dev):
        # HF layout: projections viewed as [B, S, H, D] and transposed to [B, H, S, D]
        q = torch.randn(batch, seq, hq, dim, device=dev, dtype=LP).transpose(1, 2)
        k = torch.randn(batch, seq, hk, dim, device=dev, dtype=LP).transpose(1, 2)
        inv = 1.0 / (1e6 ** (torch.arange(0, dim, 2, device=dev, dtype=torch.float32) / dim))
        pos = torch.arange(seq, device=dev, dtype=torch.float32)
        freqs = torch.outer(pos, inv).expand(batch, seq, dim // 2)
        half = (freqs.cos().contiguous(), freqs.sin().contiguous())
        full = tuple(torch.cat((t, t), dim=-1) for t in half)
        return {
            "inputs": (_leaf(q), _leaf(k)),
            "consts": (*half, *full, *(t.to(LP) for t in full)),  # see _tables
            "grad_outputs": (torch.randn_like(q), torch.randn_like(k)),
        }

    rla_bytes = 4 * (nq + nk) + 2 * 4 * batch * seq * dim // 2
    case = Case("rope", f"B{batch} S{seq} Hq{hq} Hkv{hk} D{dim}", make, rla_bytes, rla_bytes)
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    case.impls["hf"] = _tables("lp", apply_rotary_pos_emb)
    case.impls["naive"] = _tables("full", naive_rope)
    case.impls["compile"] = _tables("full", torch.compile(naive_rope, dynamic=False))
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        case.impls["liger"] = _tables("lp", LigerRopeFunction.apply)
        # Liger rotates q and k in place: give every repetition fresh copies (untimed)
        case.prepare["liger"] = lambda q, k: (_leaf(q.detach().clone()), _leaf(k.detach().clone()))
    except Exception:
        pass
    from rla import ops

    case.impls["rla"] = _tables("half", lambda q, k, cos, sin: ops.rope(q, k, cos, sin, "vllm"))
    case.impls["rla-sglang"] = _tables("half", lambda q, k, cos, sin: ops.rope(q, k, cos, sin, "sglang"))
    return case


# ---- measurement ---------------------------------------------------------------------------


def _measure(case: Case, impl: str, data: dict, reps: int, device) -> dict:
    fn = case.impls[impl]
    consts = data.get("consts", ())
    prep = case.prepare.get(impl, lambda *xs: xs)
    grads = data["grad_outputs"]

    def fwd(inputs):
        return fn(*inputs, *consts)

    def bwd(state):
        inputs, outs = state
        torch.autograd.grad(outs, [t for t in inputs if t.requires_grad], grads[: len(outs)])

    def fwd_bwd(inputs):
        outs = fwd(inputs)
        torch.autograd.grad(outs, [t for t in inputs if t.requires_grad], grads[: len(outs)])

    def fresh():
        return prep(*data["inputs"])

    def with_outputs():
        inputs = fresh()
        return inputs, fwd(inputs)

    allocs0 = torch.cuda.memory_stats(device).get("num_device_alloc", 0)
    res = {
        "fwd_ms": time_ms(fwd, fresh, reps=reps, device=device),
        "bwd_ms": time_ms(bwd, with_outputs, reps=reps, device=device),
        "fwd_bwd_ms": time_ms(fwd_bwd, fresh, reps=reps, device=device),
    }
    res["device_allocs_in_timing"] = torch.cuda.memory_stats(device).get("num_device_alloc", 0) - allocs0
    # host time of one forward call (no sync): when above the kernel time, eager timings measure it
    inputs = fresh()
    torch.cuda.synchronize(device)
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = fwd(inputs)
        host.append((time.perf_counter() - t0) * 1e6)
        del out
        torch.cuda.synchronize(device)
    res["host_fwd_us"] = statistics.median(host)
    # GPU time alone: the same work captured in a CUDA graph and replayed (no host in the loop)
    for key, body in (("graph_fwd_ms", lambda: fwd(inputs)), ("graph_fwd_bwd_ms", lambda: fwd_bwd(inputs))):
        try:
            res[key] = _graph_ms(body, reps, device)
        except Exception as e:
            res[key + "_error"] = f"{type(e).__name__}: {e}"[:200]
    inputs = fresh()
    torch.cuda.synchronize(device)
    gc.collect()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fwd_bwd(inputs)
    torch.cuda.synchronize(device)
    res["peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    res["fwd_gbs"] = case.bytes_fwd / (res["fwd_ms"] * 1e-3) / 1e9
    res["bwd_gbs"] = case.bytes_bwd / (res["bwd_ms"] * 1e-3) / 1e9
    return res


def _graph_ms(body, reps, device) -> float:
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    ms = time_ms(lambda _: graph.replay(), reps=reps, device=device)
    del graph
    return ms


def default_cases(tokens: int = 16384) -> list[Callable[[], Case]]:
    """Qwen2.5-7B shapes: intermediate 18944, hidden 3584, 28 q / 4 kv heads of 128."""
    seq = 4096 if tokens % 4096 == 0 else tokens
    return [
        lambda: swiglu_case(tokens, 18944),
        lambda: add_rms_norm_case(tokens, 3584),
        lambda: rope_case(tokens // seq, seq, 28, 4, 128),
    ]


def _measure_isolated(op: str, impl: str, tokens: int, reps: int, timeout_s: float, launch=None) -> dict:
    """``_measure`` in a fresh Python process: no allocator state, compiled code or warm caches
    left by the implementations timed before (in one process the order changed results by up
    to 2.5x, ``results/benchmarks/SUMMARY.md``, session 2)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "rla.bench.ops", "--worker", op, impl,
               "--tokens", str(tokens), "--reps", str(reps), "--json", path]
        if launch:
            cmd += ["--launch", json.dumps(launch)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"worker timed out after {timeout_s:.0f} s"}
        if proc.returncode != 0 or not os.path.exists(path):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"worker exited with {proc.returncode}: {' | '.join(tail)}"[:300]}
        with open(path) as f:
            return json.load(f)


def _worker(op: str, impl: str, tokens: int, reps: int, path: str) -> None:
    device = torch.device("cuda")
    case = next(c for c in (make() for make in default_cases(tokens)) if c.name == op)
    if impl not in case.impls:
        raise SystemExit(f"{op} has no implementation {impl!r} here (have {sorted(case.impls)})")
    res = _measure(case, impl, case.make(device), reps, device)
    with open(path, "w") as f:
        json.dump(res, f)


def run(
    out_dir="results/benchmarks", tokens: int = 16384, reps: int = 20, only=None, stem=None, impls=None,
    isolate: bool = False, worker_timeout_s: float = 300.0, launch: dict | None = None,
) -> dict:
    """``impls``: run only these implementations, in this order (default: every one, rla last).
    ``isolate``: time each implementation in its own process (``_measure_isolated``).
    ``launch``: fused-kernel launch parameters to set first (``rla.ops.set_launch_config``)."""
    if launch:
        set_launch_config(launch)
    device = torch.device("cuda")
    env = environment(device)
    env["isolated_processes"] = isolate
    copy_gbs = copy_bandwidth_gbs(device)
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s (read + write)", flush=True)
    results = []
    for make_case in default_cases(tokens):
        case = make_case()
        if only and case.name not in only:
            continue
        data = None if isolate else case.make(device)
        floor_fwd = case.bytes_fwd / (copy_gbs * 1e9) * 1e3
        floor_bwd = case.bytes_bwd / (copy_gbs * 1e9) * 1e3
        row = {"op": case.name, "shape": case.shape, "floor_fwd_ms": floor_fwd, "floor_bwd_ms": floor_bwd, "impls": {}}
        order = [i for i in impls if i in case.impls] if impls else list(case.impls)
        for impl in order:
            try:
                if isolate:
                    r = _measure_isolated(case.name, impl, tokens, reps, worker_timeout_s, launch)
                else:
                    r = _measure(case, impl, data, reps, device)
            except Exception as e:  # one broken competitor must not sink the run
                r = {"error": f"{type(e).__name__}: {e}"[:300]}
            row["impls"][impl] = r
            print(f"{case.name:13s} {impl:11s} " + (
                f"fwd {r['fwd_ms']:.3f}  bwd {r['bwd_ms']:.3f}  fwd+bwd {r['fwd_bwd_ms']:.3f} ms  "
                f"graph {r.get('graph_fwd_ms', float('nan')):.3f}/{r.get('graph_fwd_bwd_ms', float('nan')):.3f}  "
                f"host {r['host_fwd_us']:.0f} us  allocs {r['device_allocs_in_timing']}  "
                f"peak {r['peak_mib']:.0f} MiB  fwd {r['fwd_gbs']:.0f} GB/s"
                if "error" not in r else r["error"]), flush=True)
        results.append(row)
        partial = {"env": env, "copy_gbs": copy_gbs, "tokens": tokens, "reps": reps, "results": results}
        write_results(out_dir, (stem or "ops") + "_partial", partial, markdown(partial))
        del data, case
        gc.collect()
        torch.cuda.empty_cache()
    payload = {"env": env, "copy_gbs": copy_gbs, "tokens": tokens, "reps": reps, "results": results}
    md = markdown(payload)
    print(md, flush=True)
    stem = stem or f"ops_{env.get('gpu', 'gpu').replace(' ', '_')}_{env['date'][:10]}"
    write_results(out_dir, stem, payload, md)
    return payload


def _targets(row: dict) -> list[str]:
    im = row["impls"]
    rla, hf, liger = im.get("rla", {}), im.get("hf", {}), im.get("liger", {})
    if "fwd_bwd_ms" not in rla:
        return ["rla failed"]
    out = []
    if "fwd_bwd_ms" in liger:
        x = rla["fwd_bwd_ms"] / liger["fwd_bwd_ms"]
        out.append(f"fwd+bwd / Liger = {x:.2f} (target <= 0.95: {'met' if x <= 0.95 else 'MISSED'})")
    if "fwd_bwd_ms" in hf:
        x = rla["fwd_bwd_ms"] / hf["fwd_bwd_ms"]
        out.append(f"fwd+bwd / HF eager = {x:.2f} (target <= 0.5: {'met' if x <= 0.5 else 'MISSED'})")
    x = rla["fwd_ms"] / row["floor_fwd_ms"]
    out.append(f"fwd / floor = {x:.2f} (target <= 1.15: {'met' if x <= 1.15 else 'MISSED'})")
    g, lg, hg = rla.get("graph_fwd_bwd_ms"), liger.get("graph_fwd_bwd_ms"), hf.get("graph_fwd_bwd_ms")
    if g and lg:
        out.append(f"GPU-only fwd+bwd / Liger = {g / lg:.2f}")
    if g and hg:
        out.append(f"GPU-only fwd+bwd / HF eager = {g / hg:.2f}")
    if rla.get("graph_fwd_ms"):
        out.append(f"GPU-only fwd / floor = {rla['graph_fwd_ms'] / row['floor_fwd_ms']:.2f}")
    return out


def markdown(payload: dict) -> str:
    lines = [
        f"# rla per-op benchmark ({payload['env'].get('gpu')})\n",
        env_markdown(payload["env"]),
        f"Copy bandwidth measured in this run: **{payload['copy_gbs']:.0f} GB/s** (read + write). "
        "Times are medians of CUDA-event timings with the L2 flushed before each repetition; "
        "peak is memory above the inputs during one forward+backward. GPU-only columns time the "
        "same work captured in one CUDA graph and replayed (no host in the loop); host us is the "
        "Python + launch time of one forward call. "
        + ("Each implementation ran in its own Python process.\n" if payload["env"].get("isolated_processes")
           else "All implementations ran in one process, in the order listed.\n"),
    ]
    for row in payload["results"]:
        lines.append(f"\n## {row['op']} ({row['shape']})\n")
        lines.append(
            f"Bandwidth floor: forward {row['floor_fwd_ms']:.3f} ms, backward {row['floor_bwd_ms']:.3f} ms.\n"
        )
        lines.append("| impl | fwd ms | bwd ms | fwd+bwd ms | GPU-only fwd ms | GPU-only fwd+bwd ms | host us / fwd call | peak MiB | fwd GB/s | bwd GB/s | fwd / floor | GPU-only fwd / floor |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for impl, r in row["impls"].items():
            if "error" in r:
                lines.append(f"| {impl} | error: {r['error'][:80]} | | | | | | | | | | |")
                continue
            gf, gfb = r.get("graph_fwd_ms", float("nan")), r.get("graph_fwd_bwd_ms", float("nan"))
            lines.append(
                f"| {impl} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {gf:.3f} | {gfb:.3f} | "
                f"{r['host_fwd_us']:.0f} | {r['peak_mib']:.0f} | {r['fwd_gbs']:.0f} | {r['bwd_gbs']:.0f} | "
                f"{r['fwd_ms'] / row['floor_fwd_ms']:.2f} | {gf / row['floor_fwd_ms']:.2f} |"
            )
        lines.append("")
        lines.extend(f"- {t}" for t in _targets(row))
    return "\n".join(lines) + "\n"


def _main(argv=None) -> None:  # pragma: no cover  (GPU)
    import argparse

    p = argparse.ArgumentParser(description="one isolated measurement (see _measure_isolated)")
    p.add_argument("--worker", nargs=2, metavar=("OP", "IMPL"), required=True)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", required=True)
    p.add_argument("--launch", default=None, help="launch parameters as JSON (rla.ops.set_launch_config)")
    a = p.parse_args(argv)
    if a.launch:
        set_launch_config(json.loads(a.launch))
    _worker(*a.worker, a.tokens, a.reps, a.json)


if __name__ == "__main__":  # pragma: no cover
    _main()
