"""Bit-identity of the MoE rollout sampler across two checkouts: dump what one computes, compare two dumps.

    PYTHONPATH=<old checkout>/src:tests python lab/grpo/moe/rollout_bits.py dump /tmp/old.pt
    PYTHONPATH=src:tests python lab/grpo/moe/rollout_bits.py dump /tmp/new.pt
    python lab/grpo/moe/rollout_bits.py compare /tmp/old.pt /tmp/new.pt   # exit 1 if any tensor differs

What is dumped (CPU, 2 threads): seeded rollouts of the MoE experiment's sampler (``qwen3_moe`` ``10m``,
bf16, ``vllm`` profile, router region, ``record_routes``; 128 rows of 3-11 prompt tokens, up to 16 tokens,
stopping at eos), and of the four tiny router families of ``tests/moe_models.py`` (fp32 and bf16 under
``vllm-0.33``, bf16 with HF's own router points): every record's tokens, logprobs, experts and routing
weights; and per family a router-region training forward and backward (``vllm-0.33`` points and HF's
own) under ``capture_routes``, then one with the captured routes replayed (slots rolled) with their
weights: log-probabilities, captured ids and weights, every parameter's gradient. ``compare`` applies
``torch.equal`` (and equal dtype and shape) to every tensor. Used for the expert-loop change of branch
``moedecode`` against f8123a5: 1,180 tensors, none differs.
"""

from __future__ import annotations

import sys

import torch


def _records(out: dict, prefix: str, records) -> None:
    for i, r in enumerate(records):
        out[f"{prefix}/{i}/resp"] = torch.tensor(r.response_ids)
        out[f"{prefix}/{i}/lp"] = torch.tensor(r.logprobs, dtype=torch.float64)
        out[f"{prefix}/{i}/experts"] = torch.tensor(r.routes["experts"])
        out[f"{prefix}/{i}/weights"] = torch.tensor(r.routes["weights"], dtype=torch.float64)


def _train(out: dict, tag: str, model, ids) -> None:
    from rla.alignment import capture_routes, replay_routes

    model.train()
    with capture_routes(model) as cap:
        lp = model(ids).logits.float().log_softmax(-1)
    lp.gather(-1, ids[..., None]).sum().backward()
    out[tag + "/logp"], out[tag + "/cap_ids"], out[tag + "/cap_w"] = lp.detach(), cap.ids(), cap.weights()
    out.update({f"{tag}/grad/{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    b, s = ids.shape
    e = cap.ids().permute(1, 0, 2).reshape(b, s, -1, cap.ids().shape[-1])
    w = cap.weights().permute(1, 0, 2).reshape(b, s, -1, cap.ids().shape[-1])
    model.zero_grad()
    with replay_routes(model, torch.roll(e, 1, dims=-1), w):
        lp = model(ids).logits.float().log_softmax(-1)
    lp.gather(-1, ids[..., None]).sum().backward()
    out[tag + "/replay_logp"] = lp.detach()
    out.update({f"{tag}/replay_grad/{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def dump(path: str) -> int:
    import moe_models as M  # tests/, on the path

    import rla
    from rla.models import build_model, tiny_config
    from rla.profiles import REGIONS
    from rla.rollout.sampler import Sampler, SamplingParams

    torch.set_num_threads(2)
    out: dict[str, torch.Tensor] = {}
    torch.manual_seed(0)
    model = build_model(tiny_config("qwen3_moe", "10m"), seed=0)
    s = Sampler(model, profile="vllm", dtype=torch.bfloat16, device="cpu", cache="dynamic", step=0,
                regions=(*REGIONS, "router"), record_routes=True)
    prompts = [[1 + (i * 7 + j) % 20 for j in range(3 + i % 9)] for i in range(128)]
    _records(out, "10m", s.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)))
    for fam in M.FAMILIES:
        for prof, dt in (("vllm-0.33", torch.float32), ("vllm-0.33", torch.bfloat16), ("hf", torch.bfloat16)):
            regions = ("router",) if prof == "hf" else (("swiglu", "router") if fam == "deepseek_v3"
                                                       else (*REGIONS, "router"))
            s = Sampler(M.model(fam, dtype=torch.float32, gate_scale=0.02), profile=prof, dtype=dt, cache="dynamic",
                        regions=regions, record_routes=True)
            _records(out, f"{fam}/{prof}/{dt}", s.generate([[1, 5, 9, 17, 3], [1, 40], [1, 7, 100], [2] * 7],
                                                           SamplingParams(max_new_tokens=7, seed=3, ignore_eos=True)))
        for prof in ("vllm-0.33", None):
            train = M.model(fam, seed=1, gate_scale=0.02)
            if prof:
                rla.align(train, prof, regions=("router",))
            _train(out, f"{fam}/train/{prof}", train, M.tokens(batch=4, seq=16, seed=2))
    torch.save(out, path)
    print(f"{len(out)} tensors -> {path}")
    return 0


def compare(a_path: str, b_path: str) -> int:
    a, b = torch.load(a_path), torch.load(b_path)
    if a.keys() != b.keys():
        print(f"the dumps hold other tensors: {sorted(set(a) ^ set(b))[:10]}")
        return 1
    bad = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]))]
    print(f"{len(a)} tensors compared; {len(bad)} differ{': ' + ', '.join(bad[:10]) if bad else ''}")
    return 1 if bad else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "dump":
        return dump(argv[1])
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
