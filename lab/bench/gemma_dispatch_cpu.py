"""Which of rla's ops an aligned Gemma 3 runs as fused Triton kernels on CUDA, and what the rest cost.

Why ``rla bench e2e --models gemma3-4b`` found ``rla.align(model, "vllm")`` at 1.03x HF eager's
tokens/s where Liger Kernel ran at 1.32x (results/benchmarks/families_kernels_h200_2026-12-02/). Runs
on a CPU, in two parts:

1. **Census.** A small Gemma 3 text model (the 4B's layer pattern: five sliding layers, one full,
   RoPE theta 10k / 1M linear x8, q/k norms; narrow so it runs in seconds) aligned to the row the e2e
   variant used, one forward + backward. Every call into ``rla.ops`` is recorded with the path it
   takes on CUDA: ``rla.ops`` sends a call to ``backend(...)`` (the fused kernels of ``rla.ops.fused``
   when the tensors are on CUDA) or straight to ``rla.ops.reference``, whatever the device; here
   ``backend`` is replaced by a recorder that runs the reference, so the CPU takes every decision the
   CUDA run takes and the numbers stay the reference's.
2. **Traffic.** Each reference call kind found, and HF's own ``Gemma3RMSNorm`` (what the ``hf-bf16``
   variant runs), forward + backward on meta tensors at the e2e shape (2 x 4096 tokens, hidden 2560,
   q 8 x 256, k 4 x 256): the aten kernels each launches and the bytes they read and write (a
   ``TorchDispatchMode`` summing every non-view op's tensor inputs and outputs; no cache reuse
   assumed). The fused kernel's traffic is what ``rla.ops._triton_norm`` reads and writes.

``--json`` writes both parts (stamped) for the results folder.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
from datetime import datetime, timezone

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rla
from rla import ops
from rla.ops import reference

#: Gemma 3 4B's text shape (rla.bench.e2e.MODELS["gemma3-4b"]) and its e2e batch.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, TOKENS = 2560, 8, 4, 256, 2 * 4096
LAYERS_4B = 34
SKIP = {"detach", "empty", "empty_like", "empty_strided", "lift_fresh"}


def small_gemma3():
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM

    types = ["sliding_attention"] * 5 + ["full_attention"]
    cfg = Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=16, query_pre_attn_scalar=16,
        layer_types=types, tie_word_embeddings=True, use_cache=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).to(torch.bfloat16)  # cast before aligning: rla.align recomputes fp32 tables
    model.train()
    return model


def census(profile: str) -> dict:
    """{(op, path, input dtype, width, out dtype): calls} over one forward + backward."""
    calls = collections.Counter()
    originals = {name: getattr(reference, name) for name in ("rms_norm", "add_rms_norm")}

    def describe(name, args, kwargs, path):
        x = args[0]
        out = kwargs.get("out_dtype") or (args[5] if name == "rms_norm" and len(args) > 5 else None)
        out = str(out).replace("torch.", "") if out is not None else "stack dtype"
        calls[(name, path, str(x.dtype).replace("torch.", ""), int(x.shape[-1]), out)] += 1

    def direct(name):
        def call(*args, **kwargs):
            describe(name, args, kwargs, "reference (always: weight_offset)")
            return originals[name](*args, **kwargs)
        return call

    class Recorder:
        def __getattr__(self, name):
            fn = originals.get(name) or getattr(reference, name)

            def call(*args, **kwargs):
                path = "fused Triton kernel on CUDA"
                if name == "rope":  # rla.ops.fused.rope runs the reference for layouts its kernel lacks
                    from rla.ops import fused

                    q, k, cos, unsqueeze = args[0], args[1], args[2], (args[5] if len(args) > 5 else 1)
                    if fused._rope_head_axis(q, k, cos, unsqueeze) is None:
                        path = "reference (a layout the fused RoPE lacks)"
                describe(name, args, kwargs, path)
                return fn(*args, **kwargs)
            return call

    model = small_gemma3()
    report = rla.align(model, profile=profile)
    saved_backend = ops.backend
    ops.backend = lambda *tensors: Recorder()
    for name in originals:
        setattr(reference, name, direct(name))
    try:
        ids = torch.randint(0, 256, (2, 64))
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    finally:
        ops.backend = saved_backend
        for name, fn in originals.items():
            setattr(reference, name, fn)
    layers = model.config.num_hidden_layers
    rows = [dict(op=k[0], path=k[1], x_dtype=k[2], width=k[3], out_dtype=k[4], calls=n, per_layer=n / layers)
            for k, n in sorted(calls.items())]
    row = getattr(report, "profile", None)
    return {"profile": profile, "row": getattr(row, "name", str(row)), "layers": layers, "calls": rows,
            "report": str(report)}


class Traffic(TorchDispatchMode):
    """Counts the aten kernels an op launches and the bytes their tensor arguments and results hold."""

    def __init__(self):
        super().__init__()
        self.kernels = collections.Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in SKIP:
            return out
        self.kernels[name] += 1
        seen = set()
        for t in torch.utils._pytree.tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                self.bytes += t.numel() * t.element_size()
        return out


def measure(fn, *shapes_dtypes) -> dict:
    """Forward + backward of ``fn`` on meta leaves of these (shape, dtype, requires_grad)."""
    leaves = [torch.empty(s, dtype=d, device="meta").requires_grad_(g)
              for s, d, g in shapes_dtypes]
    with Traffic() as fwd:
        outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    with Traffic() as bwd:
        torch.autograd.backward([o for o in outs if o.requires_grad],
                                [torch.empty_like(o) for o in outs if o.requires_grad])
    return {"fwd_kernels": sum(fwd.kernels.values()), "bwd_kernels": sum(bwd.kernels.values()),
            "fwd_bytes": fwd.bytes, "bwd_bytes": bwd.bytes, "fwd_ops": dict(fwd.kernels), "bwd_ops": dict(bwd.kernels)}


def fused_norm_bytes(rows: int, n: int, x_bytes: int, out_bytes: int, add: bool, source: bool) -> dict:
    """What ``rla.ops._triton_norm`` reads and writes (weight and rstd rows neglected): forward
    x (+ r) -> y (+ RN(x + r)); backward dy, a (+ b) (+ d_residual) -> dx."""
    e = rows * n
    if add:  # x, r bf16 -> y, new residual bf16; backward reads dy, x, r (or the fp32 source), d_residual
        return {"fwd_bytes": e * (2 + 2 + 2 + 2), "bwd_bytes": e * (2 + 2 + (4 if source else 2) + 2 + 2)}
    return {"fwd_bytes": e * (x_bytes + out_bytes), "bwd_bytes": e * (out_bytes + x_bytes + x_bytes)}


def traffic() -> dict:
    bf, f32 = torch.bfloat16, torch.float32
    p = rla.profiles.resolve("vllm")
    w = lambda n: ((n,), bf, True)  # noqa: E731
    eps = 1e-6
    q_rows, k_rows = TOKENS * HEADS, TOKENS * KV_HEADS

    def hf_norm(x, weight):  # transformers' Gemma3RMSNorm.forward
        v = x.float()
        out = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
        return (out * (1.0 + weight.float())).type_as(x)

    def hf_add_norm(x, r, weight):  # HF's layer add, then the norm (the bench ops "hf" add_rms_norm, Gemma's norm)
        h = r + x
        return hf_norm(h, weight), h

    def hf_add_rms_norm_qwen(x, r, weight):  # rla.bench.ops add_rms_norm_case's "hf" (Qwen2RMSNorm)
        h = r + x
        hs = h.to(f32)
        hs = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + eps)
        return weight * hs.to(h.dtype), h

    cases = {
        # rla's reference norms, as the aligned Gemma layer calls them (the census's kinds)
        "rla ref rms_norm bf16 -> bf16 (post-attn / post-ff norm; first layer's input norm)":
            (lambda x, g: reference.rms_norm(x, g, eps, p, bf, None, False, 1.0), [((TOKENS, HIDDEN), bf, True), w(HIDDEN)],
             fused_norm_bytes(TOKENS, HIDDEN, 2, 2, False, False)),
        "rla ref rms_norm fp32 sum -> bf16 (input norm of layers 1.., final norm)":
            (lambda x, g: reference.rms_norm(x, g, eps, p, bf, None, True, 1.0), [((TOKENS, HIDDEN), f32, True), w(HIDDEN)],
             fused_norm_bytes(TOKENS, HIDDEN, 4, 2, False, False)),
        "rla ref add_rms_norm of source (pre-feed-forward norm)":
            (lambda x, r, s, g: reference.add_rms_norm(x, r, g, eps, p, 1.0, s),
             [((TOKENS, HIDDEN), bf, True), ((TOKENS, HIDDEN), bf, True), ((TOKENS, HIDDEN), f32, False), w(HIDDEN)],
             fused_norm_bytes(TOKENS, HIDDEN, 2, 2, True, True)),
        "rla ref rms_norm q (bf16 -> fp32, q_norm)":
            (lambda x, g: reference.rms_norm(x, g, eps, p, bf, f32, False, 1.0), [((q_rows, HEAD_DIM), bf, True), w(HEAD_DIM)],
             fused_norm_bytes(q_rows, HEAD_DIM, 2, 4, False, False)),
        "rla ref rms_norm k (bf16 -> fp32, k_norm)":
            (lambda x, g: reference.rms_norm(x, g, eps, p, bf, f32, False, 1.0), [((k_rows, HEAD_DIM), bf, True), w(HEAD_DIM)],
             fused_norm_bytes(k_rows, HEAD_DIM, 2, 4, False, False)),
        # what hf-bf16 runs in their place
        "hf Gemma3RMSNorm [8192, 2560]": (hf_norm, [((TOKENS, HIDDEN), bf, True), w(HIDDEN)], None),
        "hf layer add + Gemma3RMSNorm [8192, 2560]":
            (hf_add_norm, [((TOKENS, HIDDEN), bf, True), ((TOKENS, HIDDEN), bf, True), w(HIDDEN)], None),
        "hf Gemma3RMSNorm q [65536, 256]": (hf_norm, [((q_rows, HEAD_DIM), bf, True), w(HEAD_DIM)], None),
        "hf Gemma3RMSNorm k [32768, 256]": (hf_norm, [((k_rows, HEAD_DIM), bf, True), w(HEAD_DIM)], None),
        # the calibration case: rla bench ops' add_rms_norm "hf" at its shape, timed on the H200
        "calibration: bench ops add_rms_norm hf [16384, 3584]":
            (hf_add_rms_norm_qwen, [((16384, 3584), bf, True), ((16384, 3584), bf, True), w(3584)],
             fused_norm_bytes(16384, 3584, 2, 2, True, False)),
    }
    out = {}
    for name, (fn, leaves, fused) in cases.items():
        row = measure(fn, *leaves)
        if fused:
            row["fused_fwd_bytes"], row["fused_bwd_bytes"] = fused["fwd_bytes"], fused["bwd_bytes"]
        out[name] = row
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="vllm")
    ap.add_argument("--json", help="write both parts here")
    args = ap.parse_args(argv)
    c = census(args.profile)
    print(f"census: {args.profile!r}, {c['layers']} layers, one forward + backward (calls per layer)")
    for r in c["calls"]:
        print(f"  {r['op']:<13} {r['path']:<36} x {r['x_dtype']:<9} width {r['width']:<4} out {r['out_dtype']:<11} "
              f"{r['per_layer']:.2f}/layer ({r['calls']})")
    t = traffic()
    print("traffic at the e2e shape (meta tensors; forward + backward):")
    for name, r in t.items():
        fused = f"  fused {(r['fused_fwd_bytes'] + r['fused_bwd_bytes']) / 2**20:8.1f} MiB" if "fused_fwd_bytes" in r else ""
        print(f"  {name:<80} kernels {r['fwd_kernels']:>2} + {r['bwd_kernels']:>2}  "
              f"{(r['fwd_bytes'] + r['bwd_bytes']) / 2**20:8.1f} MiB{fused}")
    if args.json:
        import transformers

        env = {"gpu": "none (CPU: " + (platform.processor() or platform.machine()) + ")", "torch": torch.__version__,
               "transformers": transformers.__version__, "python": platform.python_version(),
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["lab/bench/gemma_dispatch_cpu.py", *(argv if argv is not None else sys.argv[1:])])}
        with open(args.json, "w") as f:
            json.dump({"environment": env, "census": c, "traffic": t, "shape": dict(
                tokens=TOKENS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, layers_4b=LAYERS_4B)},
                f, indent=1)


if __name__ == "__main__":
    main()
