"""``model.generate`` on an aligned model runs its KV-cache decode steps through the aligned ops.

Proof: every step's logits (prefill and each one-token decode against the cache) equal the
docs/rounding.md oracle run incrementally on the same prefix with its own K/V cache, and differ from
what HF's own rounding gives for the same steps.
"""

from __future__ import annotations

import pytest
import torch

import rla

from align_spec import SPEC, SpecCache, single_thread, spec_forward, tiny_model, tokens  # noqa: F401


def _spec_steps(model, prompt, generated, pts):
    """Per-step logits of the oracle: prefill on the prompt, then one token at a time with a cache."""
    cache = SpecCache()
    steps = [spec_forward(model, prompt, pts, cache=cache, last_only=True)[:, -1]]
    for t in range(generated.shape[1] - 1):
        steps.append(spec_forward(model, generated[:, t : t + 1], pts, cache=cache, last_only=True)[:, -1])
    return steps


@pytest.mark.parametrize("family,profile", [("qwen3", "vllm"), ("qwen2_moe", "sglang"), ("llama", "vllm-eager")])
def test_generate_decode_steps_follow_the_profile(family, profile):
    model = tiny_model(family, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    prompt = tokens(batch=1, seq=6, seed=5)
    rla.align(model, profile)
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True,
            pad_token_id=0,
        )
    generated = out.sequences[:, prompt.shape[1]:]
    assert generated.shape[1] == 5 and len(out.logits) == 5
    with torch.no_grad():
        spec = _spec_steps(model, prompt, generated, SPEC[profile])
        hf = _spec_steps(model, prompt, generated, SPEC["hf"])
    for step, (got, want) in enumerate(zip(out.logits, spec)):
        assert torch.equal(got, want.float()), f"step {step}"
    assert any(not torch.equal(s, h) for s, h in zip(spec, hf))  # the profile is visible in decode
    rla.unalign(model)
