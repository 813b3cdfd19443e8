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
