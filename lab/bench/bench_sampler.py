"""Rollout throughput: rla.rollout.sampler against plain HF generate, on one GPU.

Qwen2.5-0.5B shapes (random init, bf16), a batch of prompts, a fixed number of new tokens with no
early stop, sampling at temperature 1. Each arm runs once to warm up (and compile), then is timed.
A failing arm is recorded with its error, not dropped.

    python lab/bench/bench_sampler.py --out results_dir
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def model_05b(device):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1e6, tie_word_embeddings=True, eos_token_id=None, pad_token_id=0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval()


def timed(fn, sync):
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--arms", default="", help="comma-separated substrings: run only matching arms")
    ap.add_argument("--model", default="0.5b", choices=["0.5b", "bundled"],
                    help="Qwen2.5-0.5B shapes (random init) or rla's bundled 4.15M-parameter Qwen2 (the GRPO experiments' model)")
    args = ap.parse_args()
    from rla.rollout.sampler import Sampler, SamplingParams

    device = "cuda"
    if args.model == "bundled":
        from rla.models import load_bundled_model

        model = load_bundled_model(dtype=torch.bfloat16, device=device)
        model.config.eos_token_id = None  # no early stop: every arm decodes --new tokens
    else:
        model = model_05b(device)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, model.config.vocab_size - 1, (args.batch, args.prompt), generator=g)
    params = SamplingParams(max_new_tokens=args.new, seed=0)
    sync = torch.cuda.synchronize
    n_tokens = args.batch * args.new
    rows = []

    def hf(cache_implementation=None):
        def run():
            kw = {"cache_implementation": cache_implementation} if cache_implementation else {}
            model.generate(
                prompts.to(device), attention_mask=torch.ones_like(prompts).to(device), do_sample=True,
                max_new_tokens=args.new, min_new_tokens=args.new, top_k=0, top_p=1.0, temperature=1.0, **kw,
            )
        return run

    def rla_arm(**kw):
        s = Sampler(model, "vllm", **kw)
        return lambda: s.generate(prompts.tolist(), params)

    arms = [
        ("HF generate (dynamic cache)", lambda: hf()),
        ("HF generate (static cache, auto-compiled)", lambda: hf("static")),
        ("rla Sampler, vllm profile, dynamic cache", lambda: rla_arm(cache="dynamic")),
        ("rla Sampler, vllm profile, static cache, eager decode", lambda: rla_arm(cache="static", cuda_graph=False)),
        ("rla Sampler, vllm profile, static cache, CUDA-graph decode (default on GPU)", lambda: rla_arm(cache="static")),
    ]
    wanted = [a for a in args.arms.split(",") if a]
    arms = [(n, m) for n, m in arms if not wanted or any(w in n for w in wanted)]
    for name, make in arms:
        try:
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            seconds = timed(make(), sync)
            rows.append({"arm": name, "seconds": seconds, "tok_per_s": n_tokens / seconds,
                         "first_call_s": time.perf_counter() - t0 - seconds,
                         "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
        except Exception as e:  # an arm that fails is a result too
            rows.append({"arm": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(rows[-1], flush=True)
        _write(args, rows)


def _write(args, rows):
    from rla.environment import environment

    result = {
        "what": f"rollout throughput, {'Qwen2.5-0.5B shapes random init' if args.model == '0.5b' else 'bundled tiny Qwen2'} bf16",
        **environment(),  # GPU, versions, date, the exact command line
        "batch": args.batch, "prompt_len": args.prompt, "new_tokens": args.new,
        "rows": rows,
    }
    with open(f"{args.out}/sampler_{args.model}.json", "w") as f:  # rewritten after every arm: a timeout keeps what ran
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
