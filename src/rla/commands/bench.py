"""``rla bench``: time the aligned ops and an aligned training step on this GPU.

  rla bench ops   per-op: HF eager, naive upcast, torch.compile, Liger, rla (fwd, bwd, peak, GB/s)
  rla bench e2e   training step of Qwen2.5-1.5B/7B (and Qwen3, Gemma 3) shapes: HF bf16, rla (vllm, sglang), naive,
                  fp16, fp32, and (asked for by name) Liger Kernel
  rla bench all   both

Results (JSON + Markdown, stamped with GPU, versions, date and command) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json


#: ``rla.bench.e2e.VARIANTS`` plus the Liger arms (``liger``; ``liger-flce`` and ``rla-vllm+liger-flce``, Liger's
#: fused linear cross-entropy alone and under rla's regions) and the engine-backed variants (kept here: importing
#: rla.bench.e2e imports torch).
E2E_VARIANTS = ("hf-bf16", "rla-vllm", "rla-vllm-eager", "rla-sglang", "naive-upcast", "fp16", "fp32", "liger",
                "liger-flce", "rla-vllm+liger-flce", "rla-vllm-eager-kernels", "rla-vllm-pieces")


def shape(text: str) -> tuple[int, int]:
    """``BATCHxSEQ`` (e.g. ``1x512``) -> ``(batch, seq)``; the argparse type of ``--shape``."""
    try:
        batch, seq = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes BATCHxSEQ, e.g. 1x512; got {text!r}") from None
    if batch < 1 or seq < 2:
        raise argparse.ArgumentTypeError(f"--shape needs batch >= 1 and seq >= 2, got {text!r}")
    return batch, seq


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", nargs="?", choices=("ops", "e2e", "all"), default="ops")
    p.add_argument("--out", default="results/benchmarks", help="folder for the result files")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per op benchmark (ops)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per measurement (ops)")
    p.add_argument("--only", nargs="*", choices=("swiglu", "add_rms_norm", "rope"), help="ops subset")
    p.add_argument("--impls", nargs="*", default=None,
                   help="ops: implementations to time, in this order (e.g. rla liger hf; default all, rla last)")
    p.add_argument("--config", default=None, metavar="JSON",
                   help="fused-kernel launch parameters for this run (the file tune_fused.py writes)")
    p.add_argument("--isolate", action="store_true",
                   help="ops: time each implementation in its own process (no order effects)")
    p.add_argument("--models", nargs="*", default=["qwen2.5-1.5b", "qwen2.5-7b"],
                   choices=("qwen2.5-1.5b", "qwen2.5-7b", "qwen3-1.7b", "gemma3-4b"),
                   help="e2e model shapes (qwen3-1.7b: per-head q/k norms, the qk_norm_out chain; gemma3-4b: "
                        "Gemma 3 4B's text model, zero-centred sandwich norms and GeGLU)")
    p.add_argument("--variants", nargs="*", default=None, choices=E2E_VARIANTS, metavar="VARIANT",
                   help=f"e2e variants, of {' '.join(E2E_VARIANTS)} "
                        "(default: all but liger, which needs liger-kernel installed)")
    p.add_argument("--steps", type=int, default=5, help="timed training steps per variant (e2e)")
    p.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                   choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                   help="e2e: time torch.compile(model, mode=MODE) for every variant (MODE default: "
                        "default), compiled in the warm-up steps")
    p.add_argument("--shape", type=shape, default=None, metavar="BxS",
                   help="e2e: batch x sequence for every variant (default: per model, e.g. 4x4096 at 1.5B)")


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("rla bench needs a CUDA GPU; none is visible here.")
        return 2
    launch = None
    if args.config:  # for this process (e2e) and handed to the ops benchmark's workers
        from rla.ops import set_launch_config

        with open(args.config) as f:
            launch = json.load(f)
        set_launch_config(launch)
    if args.what in ("ops", "all"):
        from rla.bench import ops

        ops.run(out_dir=args.out, tokens=args.tokens, reps=args.reps, only=args.only, impls=args.impls,
                isolate=args.isolate, launch=launch)
    if args.what in ("e2e", "all"):
        from rla.bench import e2e

        e2e.run(out_dir=args.out, models=tuple(args.models),
                variants=tuple(args.variants) if args.variants else e2e.VARIANTS, reps=args.steps,
                shape=args.shape, compile_mode=args.compile)
    return 0
