"""How far the weight-delta test (rla.diagnosis.weight_delta) separates stale weights from rounding.

On the bundled model, n prompts (``--records``) x 32 new tokens, for several sampling seeds:

- rounding: rollouts of rla's sampler under an engine profile (vllm, sglang) on the checkpoint's
  own weights (must not be named);
- stale: rollouts sampled by the weights one optimizer step earlier (Adam, lr 1e-5, one SFT step
  on the fp32 master weights, then bf16), diagnosed against the stepped checkpoint (must be named);
- noise_1pct: a checkpoint with 1% weight noise sampled them; half_2pct: half the records from a
  2%-noised one.

For each: k3 of the fp32 forward against the records over the fixed-settings rounding scale (the
size tests' view), and the held-out fall of the weight-delta test with its timing. Writes
results/diagnosis/weight_delta.{json,md}.

    PYTHONPATH=src:. python -m lab.diagnosis.weight_delta_study --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

import rla.metrics as M
from rla.diagnosis.core import profile_groups
from rla.diagnosis.passes import Sizes, forward_pass
from rla.diagnosis.scale import fp32_reference, rounding_scale
from lab.diagnosis.weight_delta import FALL, LR, STEPS, TOKENS, weight_delta_test
from rla.environment import environment
from rla.rl.bundled import bundled_task, load_bundled
from rla.rollout.sampler import Sampler, SamplingParams

NEW = 32


def prompts_of(tok, n, seed=0):
    return [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"]
            for p in bundled_task().sample(seed, n)]


def sample(model, prompts, profile="vllm", seed=0):
    return Sampler(model, profile).generate(prompts, SamplingParams(max_new_tokens=NEW, seed=seed))


def one_adam_step(model, records, lr=1e-5):
    """The checkpoint after one SFT step (Adam, ``lr``) on ``records`` from ``model``'s fp32 master weights."""
    master = copy.deepcopy(model).float().train()
    opt = torch.optim.Adam(master.parameters(), lr=lr)
    ids = [r.prompt_ids + r.response_ids for r in records]
    loss = 0.0
    for r, x in zip(records, ids):
        x = torch.tensor([x])
        logits = master(input_ids=x).logits[0, len(r.prompt_ids) - 1: -1]
        loss = loss + torch.nn.functional.cross_entropy(logits.float(), x[0, len(r.prompt_ids):], reduction="sum")
    (loss / sum(len(r.response_ids) for r in records)).backward()
    opt.step()
    return master.to(torch.bfloat16).eval()


def noised(model, scale, seed=1):
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * scale * p.float().std().to(p.dtype))
    return m


def size_view(model, records):
    """k3(fp32 forward, records) / the rounding scale at the records' settings (all profiles vs fp32)."""
    sizes = Sizes()
    mu, mask = M.pad_rows([np.asarray(r.logprobs, dtype=np.float64) for r in records])
    ref = fp32_reference(model, records, sizes)
    by = {" = ".join(p.name for p in g): forward_pass(model, records, g[0], ("rope", "swiglu", "rmsnorm"), sizes)
          for g in profile_groups()}
    scale = rounding_scale(ref, by, mask)
    best = min(M.mismatch(v, mu, mask)["mismatch/k3"] for v in by.values())
    return M.mismatch(ref, mu, mask)["mismatch/k3"] / scale.k3, best / scale.k3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--records", type=int, nargs="+", default=[10, 32], help="records per case (each run)")
    ap.add_argument("--out", default="results/diagnosis")
    args = ap.parse_args()
    command = "PYTHONPATH=src:. python -m lab.diagnosis.weight_delta_study " + " ".join(
        ["--seeds", *map(str, args.seeds), "--records", *map(str, args.records)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, tok = load_bundled()
    rows = []
    for n, seed in [(n, s) for n in args.records for s in args.seeds]:
        prompts = prompts_of(tok, n, seed)
        clean = sample(model, prompts, "vllm", seed)
        cases = {
            "rounding_vllm": (model, clean),
            "rounding_sglang": (model, sample(model, prompts, "sglang", seed)),
            "stale_one_adam_step": (one_adam_step(model, clean), clean),
            "noise_1pct": (model, sample(noised(model, 0.01, seed + 1), prompts, "vllm", seed)),
            "half_2pct": (model, clean[: n // 2] + sample(noised(model, 0.02, seed + 1), prompts, "vllm", seed)[n // 2:]),
        }
        for name, (ckpt, recs) in cases.items():
            fp32_ratio, best_ratio = size_view(ckpt, recs)
            t0 = time.perf_counter()
            wd = weight_delta_test(ckpt, recs)
            dt = time.perf_counter() - t0
            rows.append({"records": n, "seed": seed, "case": name, "k3_fp32_over_scale": fp32_ratio,
                         "k3_best_profile_over_scale": best_ratio, "seconds": dt, **wd.to_dict()})
            print(f"{n} records, seed {seed} {name:22s} k3/scale {best_ratio:6.3f} fall {wd.fall:+.3f} "
                  f"(before {wd.before:.3e} after {wd.after:.3e}; fit {wd.fit_before:.3e} -> {wd.fit_after:.3e}) "
                  f"{dt:.1f}s", flush=True)
            write(out, rows, command)  # after every row: a partial run leaves what it measured


def write(out, rows, command) -> None:
    (out / "weight_delta.json").write_text(json.dumps({"environment": environment() | {"command": command},
                                                       "rows": rows,
                                                       "steps": STEPS, "lr": LR, "tokens": TOKENS, "threshold": FALL,
                                                       "command": command}, indent=2))
    (out / "weight_delta.md").write_text(summary(rows, command))


def summary(rows, command) -> str:
    """The table of the results: per record count and case, the range over seeds."""
    env = environment()
    lines = ["# The weight-delta test on the bundled model (`lab/diagnosis/weight_delta.py`)", "",
             f"Command: `{command}` (CPU: {env.get('cpu', env.get('platform', '?'))}; torch {env.get('torch', '?')}).",
             f"Fit: Adam, lr {LR:g}, {STEPS} steps, on an fp32 copy, two folds of a fixed split by record; "
             "`fall` = 1 - held-out mean squared difference after / before. "
             "k3/scale: the best profile's fully aligned bf16 forward against the records, over the rounding scale.", "",
             "| records x 32 tokens | case | k3 / scale (min-max) | fall, per seed | seconds per test |",
             "|---|---|---|---|---|"]
    for n in sorted({r["records"] for r in rows}):
        for case in dict.fromkeys(r["case"] for r in rows):
            rs = [r for r in rows if r["records"] == n and r["case"] == case]
            k = [r["k3_best_profile_over_scale"] for r in rs]
            lines.append(f"| {n} | {case} | {min(k):.3g}-{max(k):.3g} | "
                         + ", ".join(f"{r['fall']:+.2f}" for r in rs)
                         + f" | {np.mean([r['seconds'] for r in rs]):.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
