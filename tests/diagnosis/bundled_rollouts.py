"""Shared by the diagnosis tests: rollouts of the bundled model (its prompts are the ``bundled``
fixture of ``conftest.py`` here)."""

import torch

from rla.rl.bundled import bundled_task, load_bundled
from rla.rollout.sampler import Sampler, SamplingParams

N, TOKENS = 10, 32  # small: each diagnose here is ~20 tiny forwards


def bundled_prompts():
    """(the bundled model, N prompts of its task with BOS), the same on every call."""
    torch.manual_seed(0)
    model, tok = load_bundled()
    problems = bundled_task().sample(0, N)
    prompts = [[tok.bos_token_id] + tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    return model, prompts


def sample(model, prompts, profile="vllm", temperature=1.0, seed=0):
    """Records of ``prompts`` sampled by the rollout stack under ``profile``, TOKENS new tokens each."""
    return Sampler(model, profile).generate(prompts, SamplingParams(max_new_tokens=TOKENS, seed=seed,
                                                                    temperature=temperature))


def one_adam_step(model, records, lr=1e-5):
    """``model`` after one SFT step (Adam, ``lr``) on ``records``, taken on its fp32 master weights
    and returned in bf16: the policy one optimizer step after the one that sampled ``records``."""
    import copy

    master = copy.deepcopy(model).float().train()
    opt = torch.optim.Adam(master.parameters(), lr=lr)
    loss = 0.0
    for r in records:
        x = torch.tensor([r.prompt_ids + r.response_ids])
        logits = master(input_ids=x).logits[0, len(r.prompt_ids) - 1: -1]
        loss = loss + torch.nn.functional.cross_entropy(logits.float(), x[0, len(r.prompt_ids):], reduction="sum")
    (loss / sum(len(r.response_ids) for r in records)).backward()
    opt.step()
    return master.to(torch.bfloat16).eval()


def unrecorded(records):
    """``records`` without the ``policy`` field (an engine that does not write it): what the size
    tests alone make of rollouts of other weights."""
    import dataclasses

    return [dataclasses.replace(r, policy=None) for r in records]
