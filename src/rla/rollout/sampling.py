"""How an engine turns logits into the logprob it reports: one implementation for both stacks.

vLLM (``logprobs_mode="processed_logprobs"``) and SGLang report the logprob of the sampled token
after the logits were upcast to fp32, divided by the temperature and filtered by top-k / top-p;
the filtered distribution is renormalised. The rollout sampler (``rla.rollout.sampler``) and the
training-side recomputation (``rla.logprobs``, in ``rla.rollout.train_logprobs``) both call :func:`process_logits`, so any
difference between their logprobs comes from the forward pass, not from this step.

:func:`sample_token` draws the next token from the processed distribution without a host sync,
so that the whole token loop can be replayed as one CUDA graph (``rla.rollout.token_loop``).
"""

from __future__ import annotations

import torch

__all__ = ["process_logits", "check_sampling_params", "sample_token"]


def check_sampling_params(temperature: float, top_p: float, top_k: int) -> None:
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be > 0, got {temperature!r} (greedy is not a sampling policy)")
    if not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, int) or (top_k < 1 and top_k not in (-1, 0)):
        raise ValueError(f"top_k must be a positive int, or -1/0 for 'disabled', got {top_k!r}")


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Processed log-probabilities [..., V] in fp32: logits.float() / T, top-k, top-p, log_softmax.

    ``top_k`` of -1 or 0 disables top-k; ``top_p`` of 1 disables top-p. Filtered-out tokens get
    -inf. Ties at the top-k boundary keep every token equal to the k-th value (as a threshold
    comparison does in vLLM's sampler).
    """
    x = logits.float() / temperature
    if top_k is not None and top_k > 0 and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p; keep at least one
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[..., 0] = False
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample_token(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ([V] or [B, V], unnormalised is fine) -> indices, [1] or [B, 1].

    Equal to ``torch.multinomial(probs, 1, generator=generator)`` -- the same index, and the
    generator left in the same state -- without its host sync. For one sample, ATen's multinomial
    (torch 2.11-2.14, ``aten/src/ATen/native/Distributions.cpp``) takes its exponential-race path:
    it fills a tensor like ``probs`` with Exp(1) draws from ``generator``, divides ``probs`` by it
    and returns the argmax (``p_i / q_i`` is largest for token i with probability ``p_i / sum p``).
    Before drawing it checks the input with ``.item()`` (no inf/nan/negative entry, no all-zero
    row), which blocks the host until the GPU has caught up: once per token, and it cannot be
    captured in a CUDA graph. This function runs the same draw, division and argmax on the same
    dtype, so it consumes the same random numbers and returns the same index bit for bit: rollouts
    sampled before and after the change are identical for a given seed. The input check is the
    caller's job (``rla.rollout.token_loop`` flags NaN rows on the device and raises once per
    generate); a NaN entry here would win the argmax instead of raising.
    """
    if not probs.is_floating_point():
        raise TypeError(f"sample_token needs floating-point probabilities, got {probs.dtype}")
    if probs.dim() not in (1, 2):
        raise ValueError(f"sample_token needs probabilities of shape [V] or [B, V], got {tuple(probs.shape)}")
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / race, dim=-1, keepdim=True)
