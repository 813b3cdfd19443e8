"""Where the host time of a small, host-bound training step goes (cProfile), per variant.

At Qwen2.5-1.5B shapes and 1 x 512 tokens the GPU finishes each kernel before the host launches
the next, so the step time is the host's time. One variant per process (Liger's patch is global):
  python lab/bench/host_step.py --variant rla-vllm --out F.json [--shape 1x512] [--top 30]
                                 [--compile MODE]
Writes the median step time (CUDA events, 20 steps), the total Python function-call count of one
step, and the top functions by own time of 5 profiled steps; with ``--compile`` also Dynamo's
counters (graphs, graph breaks, recompiles) after the timed steps.
"""

import argparse
import cProfile
import io
import json
import pstats

import torch

from rla.bench import e2e
from rla.environment import environment
from rla.commands.bench import shape


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", required=True, choices=("hf-bf16", "rla-vllm", "rla-sglang", "liger"))
    ap.add_argument("--model", default="qwen2.5-1.5b", choices=tuple(e2e.MODELS))
    ap.add_argument("--shape", type=shape, default=(1, 512))
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--compile", default=None, choices=("default", "reduce-overhead"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model = e2e.build_model(args.model, torch.bfloat16)
    undo, how = (lambda: None), "none"
    if args.variant != "hf-bf16":
        undo, how = e2e._align(model, args.variant)
    stepper = torch.compile(model, mode=args.compile) if args.compile else model
    timed = e2e._time_steps(stepper, *args.shape, warmup=3, reps=20)
    step = e2e.training_step(stepper, torch.randint(0, model.config.vocab_size, args.shape, device="cuda"))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    prof.disable()
    undo()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    counters = {}
    if args.compile:
        from torch._dynamo.utils import counters as dynamo_counters

        counters = {k: dict(v) for k, v in dynamo_counters.items() if v}
    out = {"env": environment(), "variant": args.variant, "aligned_by": how, "model": args.model,
           "compile": args.compile, "dynamo_counters": counters,
           "shape": list(args.shape), "step_ms_median": timed["step_ms"], "step_ms": timed["step_ms_all"],
           "calls_per_step": stats.total_calls / 5, "profile_top_tottime": text.getvalue()}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{args.variant:10s} {out['step_ms_median']:.1f} ms/step  {out['calls_per_step']:.0f} Python calls/step")
    print(json.dumps(counters, default=str)[:3000])
    print(text.getvalue())


if __name__ == "__main__":
    main()
