"""How an engine turns logits into the logprob it reports: one implementation for both stacks.

vLLM (``logprobs_mode="processed_logprobs"``) and SGLang report the logprob of the sampled token
after the logits were upcast to fp32, divided by the temperature and filtered by top-k / top-p;
the filtered distribution is renormalised. The rollout sampler (``rla.rollout.sampler``) and the
training-side recomputation (``rla.logprobs``, in ``rla.rollout.train_logprobs``) both call :func:`process_logits`, so any
difference between their logprobs comes from the forward pass, not from this step.
"""

from __future__ import annotations

import torch

__all__ = ["process_logits", "check_sampling_params"]


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
