"""GRPO and REINFORCE losses, group advantages and rollout importance-sampling corrections.

Everything here is a pure function of tensors in the *flat token layout*: the response tokens of
a batch laid end to end in one vector, with ``seq[i]`` the index of the sequence token ``i``
belongs to. That layout is what the chunked training forward (``rla.rl.forward``) produces, it
has no padding to mask, and sequence-level quantities are an ``index_add`` away.

The quantity this module exists for is the PPO ratio at step 0. With ``pi_old`` taken from the
rollout engine's recorded logprobs mu (``old_logprobs = rollout``), the ratio of the first update
of a step is ``exp(log pi_train - log mu)``: on identical weights it is 1 only if both stacks
round alike. Under BF16 it is not, so clipping fires on tokens no update has touched yet ("clip
leak") and the surrogate pushes on noise. With one update per rollout batch this ratio is the pure
mismatch; with several mini-batches or epochs it also drifts legitimately.

Conventions (each as verl / TRL define them):

* GRPO advantage: ``A = (r - mean_g(r)) / (std_g(r) + 1e-6)`` over the group of responses to one
  prompt; ``std`` is the unbiased sample std (``torch.std``, as TRL); ``scale="none"`` keeps only
  the centring (Dr. GRPO). Every token of a response gets its sequence's advantage.
* PPO-clip: ``loss_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))``; a token is
  *clipped* when the clipped branch is the larger (verl's ``pg_clipfrac``).
* REINFORCE: ``loss_t = -A log pi_t``: the on-policy gradient that ignores mu entirely (its bias
  under mismatch is what TIS corrects).
* Aggregation: ``token-mean`` weighs every response token in the mini-batch equally (DAPO, verl
  ``token-mean``); ``seq-mean-token-mean`` averages within each sequence, then over sequences
  (the GRPO paper). Expressed as per-token weights so micro-batches and ranks just add up.
* Importance weights (``w``, detached, multiply the per-token loss), from the training stack's
  pi_old (the forward before the first update of the step) against mu, as verl's rollout
  correction and TRL's ``vllm_importance_sampling_*`` compute them:
  ``tis``: ``w_t = min(exp(log pi_old_t - log mu_t), C)`` (verl ``rollout_is=token``, TRL
  ``token_truncate``); ``mis``: ``w_i = rho_i if rho_i <= C else 0`` with the sequence ratio
  ``rho_i = exp(sum_t (log pi_old_t - log mu_t))`` on every token of sequence i (TRL
  ``sequence_mask``; the masked IS of "When Speed Kills Stability").
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "group_advantages",
    "aggregation_weights",
    "importance_weights",
    "per_token_loss",
    "entropy_from_logprobs",
]


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Per-response advantages from ``rewards`` [N], N a multiple of ``group_size``.

    Groups are consecutive: responses ``g*group_size .. (g+1)*group_size - 1`` answer prompt g.
    A group whose rewards are all equal gets advantage 0 (it carries no signal).
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if scale not in ("group", "none"):
        raise ValueError(f"scale must be 'group' or 'none', got {scale!r}")
    r = rewards.view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale == "group":
        if group_size < 2:
            raise ValueError("scale='group' needs group_size >= 2 (the std of one value is undefined)")
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)


def aggregation_weights(lengths: torch.Tensor, mode: str, n_tokens: float | None = None,
                        n_seqs: float | None = None) -> torch.Tensor:
    """Per-sequence weight of each of its tokens so that ``sum_t w_t loss_t`` is the aggregate.

    ``lengths``: response lengths of the sequences at hand; ``n_tokens`` / ``n_seqs``: totals
    over the whole mini-batch (all micro-batches, all ranks), by default those of ``lengths``.
    ``token-mean``: ``1 / n_tokens``; ``seq-mean-token-mean``: ``1 / (L_i * n_seqs)``.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    if (lengths < 1).any():
        raise ValueError("every sequence needs at least one response token")
    n_tokens = float(lengths.sum()) if n_tokens is None else float(n_tokens)
    n_seqs = float(lengths.numel()) if n_seqs is None else float(n_seqs)
    if mode == "token-mean":
        return torch.full_like(lengths, 1.0 / n_tokens)
    if mode == "seq-mean-token-mean":
        return 1.0 / (lengths * n_seqs)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def importance_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    seq: torch.Tensor,
    n_seqs: int,
    mode: str,
    cap: float,
) -> torch.Tensor:
    """Detached rollout-correction weights per token (flat layout), 1 everywhere for ``"none"``.

    ``old_logprobs``: the training stack's log pi_old (before any update of this step);
    ``rollout_logprobs``: the engine's log mu. Sequence sums are taken in fp64 and compared in
    log space, so a long sequence with a large summed log-ratio is masked, never an inf or NaN.
    """
    old = old_logprobs.detach().double()
    mu = rollout_logprobs.detach().double().to(old.device)
    if mode == "none":
        return torch.ones_like(old, dtype=torch.float32)
    delta = old - mu
    if mode == "tis":
        return delta.clamp(max=math.log(cap)).exp().float()
    if mode == "mis":
        s = torch.zeros(n_seqs, dtype=torch.float64, device=old.device).index_add_(0, seq.to(old.device), delta)
        keep = s <= math.log(cap)
        w_seq = torch.where(keep, s.clamp(max=math.log(cap)).exp(), torch.zeros_like(s))
        return w_seq[seq.to(old.device)].float()
    raise ValueError(f"unknown importance-sampling correction {mode!r}")


def per_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    algorithm: str = "grpo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss_t, clipped_t, ratio_t)`` for each token (flat layout).

    ``clip_ratio_c`` is dual-clip PPO as verl has it (``clip_ratio_c``, default 3 there): for
    negative advantages the loss is capped at ``-A * c``, so a token whose ratio exceeds ``c``
    stops contributing gradient (plain PPO-clip leaves ``-A * r`` unbounded above for ``A < 0``).

    ``logprobs``: log pi_theta with grad; ``old_logprobs``: the ratio's denominator (the
    rollout's mu or the training stack's pi_old; detached here); ``advantages``: per token.
    ``clipped_t`` is a bool (always False for REINFORCE), ``ratio_t`` the detached ratio.
    """
    old = old_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    log_ratio = logprobs - old
    ratio = torch.exp(log_ratio)
    if algorithm == "grpo":
        unclipped = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        loss = torch.maximum(unclipped, clipped)
        is_clipped = clipped > unclipped
        if clip_ratio_c is not None:
            dual = -adv * clip_ratio_c
            capped = (adv < 0) & (dual < loss)
            loss = torch.where(capped, dual, loss)
            is_clipped = is_clipped | capped
    elif algorithm == "reinforce":
        loss = -adv * logprobs
        is_clipped = torch.zeros_like(loss, dtype=torch.bool)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    if weights is not None:
        loss = loss * weights.detach().to(loss.dtype)
    return loss, is_clipped.detach(), ratio.detach()


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of a (possibly top-k/top-p filtered) log-distribution, in nats.

    Filtered tokens hold -inf and contribute 0 (``0 * log 0 = 0``), not NaN.
    """
    p = logp.exp()
    return -(p * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum(-1)
