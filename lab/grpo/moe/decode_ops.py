"""Ops per decode step of the experiment's rollout sampler, and how many of them block the host on CUDA.

    PYTHONPATH=src python lab/grpo/moe/decode_ops.py --out results/experiments/moe_routing_h200_2026-12-02/decode_ops.json

Why: the MoE experiment's sizing (``lab/grpo/moe/README.md``) scaled the dense run's measured rollout time
by ops per decode step; the rollouts took ~6x longer than that. A CUDA op the host must wait for (a
``nonzero``, an ``item`` of a CUDA scalar, a copy to the CPU) drains the process's queue; 15 processes
share the GPU, so a wait can be long. This counts the ``nonzero`` and ``item`` ones (``_local_scalar_dense``,
which ``bool()``, ``int()``, ``F.one_hot``'s range check and indexing by a 0-d tensor also call) on the CPU:
the same Python path issues the same ops on CUDA; on the CPU they cost nothing, so only their number is
measured here, not their time. ``host_copies`` adds the calls that copy a tensor to the host (``.cpu()``,
``.tolist()``, ``.numpy()``, counted at the Python call: on the CPU run a ``.cpu()`` is a no-op the
profiler does not see); ``.to(device)`` is not counted (HF moves its masks with ``.to(device)`` on the
same device), nor are copies of tensors that live on the host (per rollout, so they cancel in the
difference below). ``syncs_total`` = ``blocking_on_cuda_total`` + the host copies: what the host waits on
per decode step with the sampler on a GPU.

Run it on the code before a change with ``PYTHONPATH=<old checkout>/src`` (the script uses the
public API only) to measure both sides.

Both samplers are built as ``rla.rl.trainer`` builds them: the 10m Qwen3-MoE (7 layers, 8 experts,
top-2) with the router region and ``record_routes`` on a dynamic cache, and the dense Qwen2 ``tiny``
(the 2026-11-29 GRPO run's model) on a dynamic cache; random weights, prompts of 12 tokens, ``ignore_eos``;
the MoE at 1, 8 and 128 rows (the experiment's 16 x 8; the router region's expert loop runs once per
expert a decode step hits, so the count grows with the rows), the dense at 128. Per decode step: (profile
of a 6-token rollout - profile of a 2-token one) / 4.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch

#: ops that wait for the device when their input is a CUDA tensor
BLOCKING = ("aten::nonzero", "aten::_local_scalar_dense")


#: Tensor methods that copy to the host (counted by name at the Python call)
HOST_COPIES = ("cpu", "tolist", "numpy")


def _copy_counter():
    from torch.overrides import TorchFunctionMode

    class Copies(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.n = collections.Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in HOST_COPIES and args and isinstance(args[0], torch.Tensor):
                self.n[name] += 1
            return func(*args, **(kwargs or {}))

    return Copies()


def _count(sampler, prompts, n: int):
    from torch.profiler import ProfilerActivity, profile

    from rla.rollout.sampler import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True, seed=0)
    copies = _copy_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof, copies:
        sampler.generate(prompts, params)
    top, every = collections.Counter(), collections.Counter()
    for e in prof.events():
        every[e.name] += 1
        if e.cpu_parent is None and e.name.startswith("aten::"):
            top[e.name] += 1
    every.update({f"host_copy::{k}": v for k, v in copies.n.items()})
    return top, every


def per_decode_step(arch: str, size: str, moe: bool, batch: int = 128) -> dict:
    from rla.models import build_model, tiny_config
    from rla.profiles import REGIONS
    from rla.rollout.sampler import Sampler

    torch.manual_seed(0)
    cfg = tiny_config(arch, size)
    model = build_model(cfg, seed=0)
    kw = dict(regions=(*REGIONS, "router"), record_routes=True) if moe else {}
    sampler = Sampler(model, profile="vllm", dtype=torch.bfloat16, device="cpu", cache="dynamic", step=0, **kw)
    prompts = [[1 + (i * 7 + j) % 20 for j in range(12)] for i in range(batch)]
    _count(sampler, prompts[:8], 2)  # warm-up
    (t2, e2), (t6, e6) = _count(sampler, prompts, 2), _count(sampler, prompts, 6)
    step = lambda a, b, k: (a[k] - b[k]) / 4  # noqa: E731
    return {
        "arch": arch, "size": size, "batch": batch, "layers": cfg.num_hidden_layers,
        "experts": getattr(cfg, "num_experts", None), "top_k": getattr(cfg, "num_experts_per_tok", None),
        "top_level_aten_ops": sum(t6.values()) / 4 - sum(t2.values()) / 4,
        "blocking_on_cuda": {k: step(e6, e2, k) for k in BLOCKING},
        "blocking_on_cuda_total": sum(step(e6, e2, k) for k in BLOCKING),
        "host_copies": {k: step(e6, e2, f"host_copy::{k}") for k in HOST_COPIES},
        "syncs_total": sum(step(e6, e2, k) for k in BLOCKING) + sum(step(e6, e2, f"host_copy::{k}") for k in HOST_COPIES),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--moe-batches", default="1,8,128", help="the MoE sampler's row counts, comma-separated")
    ap.add_argument("--code", default=None, help="which code was measured (a commit), recorded in the JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    from rla.environment import environment

    env = environment(torch.device("cpu"))
    env["command"] = "python " + " ".join(sys.argv)
    if args.code:
        env["code"] = args.code
    rows = [per_decode_step("qwen3_moe", "10m", True, int(b)) for b in args.moe_batches.split(",")] + [per_decode_step("qwen2", "tiny", False)]
    with open(args.out, "w") as f:
        json.dump({"environment": env, "prompt_tokens": 12, "rows": rows}, f, indent=1)
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
