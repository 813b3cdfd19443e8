"""Rollout speed of the token loop as one CUDA graph per 8 tokens, against the per-token loop.

    PYTHONPATH=src python3 lab/bench/h200_decode_loop.py --out DIR      (one GPU, < 3 minutes)

Shapes as the GRPO runs use them: the bundled model's ``tiny`` Qwen2 (4.1M parameters) and the
``50m`` one (52M), built as ``rla.rl`` builds them (``rla.models.tiny_config`` + ``build_model``,
random init: with ``ignore_eos`` the weights do not change the work), bf16 engine copy aligned to
the vllm profile; 64 prompts of 30 tokens, 1024 new tokens each, temperature 1, no early stop.

Arms, per model:

- ``per_token``: ``Sampler.generate`` as it was before the token loop -- the decode step is a CUDA
  graph (``StaticDecoder.decode``), and between steps the host runs process_logits,
  ``torch.multinomial``, gather, where, isin and the copies into the step's buffers. Written out
  below (:func:`per_token_generate`), since the sampler no longer has it.
- ``graph_loop``: today's ``Sampler.generate``: 8 tokens of sampling and decoding per graph replay.

Both arms return the same per-row (ids, logprobs) lists, built the same way. Each arm runs once to
warm up (captures) and is then timed over ``--reps`` calls. The JSON also says whether the
captured loop equals the eager one (``cuda_graph=False``) and the per-token loop bit for bit
(token ids and fp32 logprobs of every row) on one call with the same seed, and, as the control,
whether each path equals itself run twice. With the default SDPA backends neither does on the
H200 at this size: torch picks cuDNN's attention kernel for the masked decode, and it is not
run-to-run deterministic there, so the cross-path checks cannot come out True. The JSON therefore
repeats all three checks with cuDNN's SDPA disabled (``no_cudnn_sdp``), where a diagnostic run
found every one True (64 x 256 tokens, 4M).

Prediction, written before the first measurement. Per token the old path costs the host one graph
launch plus ~25 eager op launches (process_logits: float, div, log_softmax; exp; multinomial's own
max, min, and, sum, eq, sum, exponential_, div, argmax; gather, where x2, isin, or; the three
copies into the decode buffers), and two ``.item()`` syncs inside multinomial, so host and GPU
take turns instead of overlapping. On this machine's host an eager op costs ~25-40 us (SUMMARY.md,
sessions 2-3): ~0.8-1.0 ms per token of host time that the GPU waits through. The earlier
measurement of the bundled model (``ops_inductor_sampler_h200_2026-11-29/sampler_bundled.json``:
1.65 ms per token) fits GPU ~0.6 ms + host ~1 ms. The new path leaves the GPU time (decode graph
+ ~25 sampling kernels of a few us each on a 64-token vocabulary, ~0.1 ms) and ~1/8 of a replay
launch and one done-check sync per 8 tokens on the host, which overlap. Hence:

- 4M (GPU ~0.6-0.7 ms/token): ~1.7 ms -> ~0.75 ms per token, **~2.0-2.5x** tokens/s
  (about 1.7 s -> 0.75 s per 1024-token generate of 64 rows);
- 52M (12 layers, ~2x the kernels, GPU ~1.3-1.6 ms/token): ~2.4 ms -> ~1.6 ms, **~1.4-1.6x**.

The gain shrinks as the model grows because only host time goes away; and several runs per
process (``rla.rl.run_group``) should gain more than one run alone, since the host time removed
is what the GIL serialised.

Measured (H200, 2026-12-01, ``results/benchmarks/h200_2026-12-01_decode_loop.md``): the prediction
was wrong. 1.03x (4M) and 1.01x (52M), and 1.02x / 1.00x with 7 threads. The per-token path was
not host-bound at this shape: the decode graph's GPU time is ~1 ms per token, and the host's ~25
ops per token hid behind it. A profile of the eager step puts 53% of the GPU time in two copies
per layer per token -- HF's ``repeat_kv`` materialising the grouped K/V of the *whole* static cache
(1088 columns) because an explicit mask rules out SDPA's ``enable_gqa`` -- and 15% in cuDNN
attention over those 1088 columns, masked or not. That, not the host, is what to attack next.

``--threads N`` adds N samplers as threads of one process, one CUDA stream each (~2 minutes more
for N=7).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch


@torch.no_grad()
def per_token_generate(sampler, prompts: list[list[int]], params, decoders: dict):
    """The pre-token-loop ``Sampler.generate`` on the static cache -> (ids [n, T], fp64 logprobs).

    ``decoders`` keeps one decoder (cache and decode graph) per shape across calls, as the sampler did."""
    from rla.rollout.sampling import process_logits
    from rla.rollout.static_decode import StaticDecoder, bucket

    n, longest, dev = len(prompts), max(len(p) for p in prompts), sampler.device
    ids = torch.full((n, longest), sampler.pad_id, dtype=torch.long)
    mask = torch.zeros((n, longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    key = (n, bucket(longest + params.max_new_tokens))
    if key not in decoders:
        decoders[key] = StaticDecoder(sampler.model, sampler._cache_kw, n, key[1], capture=sampler.cuda_graph,
                                     attention="model")  # as it ran on 2026-12-01
    dec = decoders[key]
    gen = torch.Generator(device=dev).manual_seed(params.seed)
    stops = sorted(set(() if params.ignore_eos else sampler.eos_ids) | set(params.stop_token_ids))
    stops_t = torch.tensor(stops, dtype=torch.long, device=dev)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = dec.prefill(ids, mask, positions)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    out_ids, out_lp = [], []
    for step in range(params.max_new_tokens):
        logp = process_logits(logits.clone(), params.temperature, params.top_k, params.top_p)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, sampler.pad_id), nxt)
        out_ids.append(nxt)
        out_lp.append(torch.where(done, torch.zeros_like(lp), lp))
        done = done | torch.isin(nxt, stops_t)
        if step == params.max_new_tokens - 1 or (step % 8 == 7 and bool(done.all())):
            break
        positions = positions[:, -1:] + 1
        logits = dec.decode(nxt[:, None], positions, longest + step)
    ids, lps = torch.stack(out_ids, 1).cpu().tolist(), torch.stack(out_lp, 1).double().cpu().tolist()
    ends = [next((t + 1 for t, tok in enumerate(row) if tok in stops), len(row)) for row in ids]  # as generate cuts
    return [row[:e] for row, e in zip(ids, ends)], [row[:e] for row, e in zip(lps, ends)]


def graph_loop_generate(sampler, prompts, params):
    """Today's ``Sampler.generate`` -> (response ids, logprobs) per row, as :func:`per_token_generate`."""
    recs = sampler.generate(prompts, params)
    return [r.response_ids for r in recs], [r.logprobs for r in recs]


def threaded_tok_s(fns, tokens_per_call: int) -> float:
    """Aggregate tokens/s of ``fns`` run at once, one thread and one CUDA stream each (as
    ``rla.rl.run_group`` runs several runs in one process); each runs once before, to capture."""
    streams = [torch.cuda.Stream() for _ in fns]
    for fn, st in zip(fns, streams):
        with torch.cuda.stream(st):
            fn()
    torch.cuda.synchronize()
    barrier = threading.Barrier(len(fns) + 1)

    def work(fn, st):
        with torch.cuda.stream(st):
            barrier.wait()
            fn()
            st.synchronize()

    threads = [threading.Thread(target=work, args=(fn, st)) for fn, st in zip(fns, streams)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return len(fns) * tokens_per_call / (time.perf_counter() - t0)


def timed(fn, reps: int) -> tuple[float, float, object]:
    """(first call incl. capture, mean of ``reps`` timed calls in s, the first call's result)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    first_out = fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return first, (time.perf_counter() - t0) / reps, first_out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="tiny,50m")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=30)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="also run this many samplers as threads of one process")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("h200_decode_loop.py measures the CUDA-graph loop: it needs a CUDA GPU")
    from rla import models
    from rla.environment import environment
    from rla.rollout.sampler import Sampler, SamplingParams

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=0, ignore_eos=True)
    result = {"what": "rollout tokens/s, per-token loop vs 8-token CUDA-graph loop", **environment(),
              "batch": args.batch, "prompt_len": args.prompt, "new_tokens": args.new, "reps": args.reps,
              "profile": "vllm", "rows": []}
    for size in args.sizes.split(","):
        config = models.tiny_config("qwen2", size)
        model = models.build_model(config, dtype=torch.float32, seed=0)
        prompts = torch.randint(3, config.vocab_size, (args.batch, args.prompt), generator=g).tolist()
        graphed = Sampler(model, "vllm", device="cuda", decode_attention="model")
        row = {"size": size, "params": models.param_count(config)}
        decoders = {}
        for arm, fn in (("per_token", lambda: per_token_generate(graphed, prompts, params, decoders)),
                        ("graph_loop", lambda: graph_loop_generate(graphed, prompts, params))):
            torch.cuda.reset_peak_memory_stats()
            first, sec, _ = timed(fn, args.reps)
            row[arm] = {"seconds_per_generate": sec, "tok_per_s": args.batch * args.new / sec, "first_call_s": first,
                        "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
            print(size, arm, row[arm], flush=True)
        row["speedup"] = row["per_token"]["seconds_per_generate"] / row["graph_loop"]["seconds_per_generate"]
        new = graph_loop_generate(graphed, prompts, params)
        eager = Sampler(model, "vllm", device="cuda", decode_attention="model", cuda_graph=False)
        old = per_token_generate(graphed, prompts, params, decoders)
        row["graph_equals_eager_bitwise"] = new == graph_loop_generate(eager, prompts, params)
        row["graph_equals_per_token_bitwise"] = new == old
        # the control: is the forward itself reproducible at this size? (the same path twice)
        row["per_token_run_to_run_bitwise"] = old == per_token_generate(graphed, prompts, params, decoders)
        row["graph_run_to_run_bitwise"] = new == graph_loop_generate(graphed, prompts, params)
        # the same checks with cuDNN's SDPA kernel ruled out (fresh samplers, so fresh captures)
        torch.backends.cuda.enable_cudnn_sdp(False)
        try:
            graphed_nc = Sampler(model, "vllm", device="cuda", decode_attention="model")
            new = graph_loop_generate(graphed_nc, prompts, params)
            row["no_cudnn_sdp"] = {
                "graph_equals_eager_bitwise": new == graph_loop_generate(eager, prompts, params),
                "graph_equals_per_token_bitwise": new == per_token_generate(graphed_nc, prompts, params, {}),
                "graph_run_to_run_bitwise": new == graph_loop_generate(graphed_nc, prompts, params),
            }
            del graphed_nc
        finally:
            torch.backends.cuda.enable_cudnn_sdp(True)
        print(size, {k: v for k, v in row.items() if "bitwise" in k or k == "no_cudnn_sdp"}, flush=True)
        if args.threads:
            many = [Sampler(model, "vllm", device="cuda", decode_attention="model") for _ in range(args.threads)]
            tokens = args.batch * args.new
            dicts = [{} for _ in many]
            row[f"threads_{args.threads}"] = {
                "per_token_tok_per_s": threaded_tok_s(
                    [lambda s=s, d=d: per_token_generate(s, prompts, params, d) for s, d in zip(many, dicts)], tokens),
                "graph_loop_tok_per_s": threaded_tok_s(
                    [lambda s=s: graph_loop_generate(s, prompts, params) for s in many], tokens),
            }
            print(size, "threads", row[f"threads_{args.threads}"], flush=True)
            del many, dicts
        result["rows"].append(row)
        path = out / "h200_decode_loop.json"
        path.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a cut run keeps what it measured
        print(f"wrote {path}", flush=True)
        del graphed, eager, model, decoders
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
