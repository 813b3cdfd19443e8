"""The weight-delta test, a study: are the recorded logprobs those of slightly different weights?

A size test cannot tell the policy one optimizer step stale from rounding (k3 inside the
rounding scale). The hypothesis studied here: a stale policy's logprob differences are the effect
of one small change of the weights, the same on every record, so a weight delta fitted to some
records explains the others too; rounding noise is a different error on every token, and a delta
fitted to it does not carry over. It lives in the lab, not in ``rla.diagnosis``, because on the
bundled model it does not separate the two (``results/diagnosis/weight_delta.md``: the held-out
fall of rounding cases and of the one-step-stale case overlap over seeds, at 10 and at 32
records); ``rla diagnose`` names stale weights from the records' ``policy`` field instead
(:mod:`rla.diagnosis.policy`).

The test, on an fp32 copy of the checkpoint (bf16 -> fp32 is exact: the same weights, with
rounding far smaller than the engine's):

1. split the records in two halves by record, with a fixed seed (:data:`SEED`): *fit* and
   *held out*; at most ``tokens`` response tokens of each half are used (records in their order
   after the shuffle, whole records, at least one);
2. ``before``: the mean squared difference ``(log pi - log mu)^2`` over the held-out tokens, pi
   the fp32 forward at each record's own temperature / top-k / top-p (the engines' processing,
   :func:`rla.rollout.sampling.process_logits`);
3. ``steps`` Adam steps at learning rate ``lr`` on the fit half, objective the mean squared
   difference over its tokens (Adam's first step moves every weight by about ``lr`` in the
   direction that reduces it, as one optimizer step of a trainer does);
4. ``after``: the held-out mean squared difference with the fitted weights.

Both halves are fitted in turn (two folds) and the squared differences pooled. The *fall*
``1 - after / before`` would name ``different_weights`` at :data:`FALL` or more. The held-out
half decides, so a delta that only memorises the fit half's tokens (there are far more weights
than tokens) cannot pass the test.

Cost: three fp32 copies of the weights (the model, Adam's two moments) and ``steps`` forward and
backward passes over at most ``tokens`` tokens plus records' prompts, and two no-grad forwards of
the held-out half; memory of one backward over the fit half (micro-batched by ``max_tokens``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from rla.rollout.rollouts import to_padded
from rla.rollout.sampling import process_logits

__all__ = ["WeightDelta", "weight_delta_test", "FALL", "STEPS", "LR", "TOKENS", "SEED"]

FALL = 0.3
"""The share of the held-out mean squared difference a fit would have to remove (the study's
candidate threshold; no threshold separates the measured cases)."""
STEPS = 5
"""Adam steps of the fit (the ``steps`` default)."""
LR = 1e-6
"""The fit's Adam learning rate: the size of one trainer step, not of a fine-tune."""
TOKENS = 4096
"""At most this many response tokens in each half (the ``tokens`` default)."""
SEED = 0
"""Seed of the split by record."""
MIN_RECORDS = 4
"""The test needs at least this many records (two in each half)."""


@dataclass
class WeightDelta:
    before: float
    """Held-out mean squared difference (log pi - log mu)^2 with the checkpoint's weights (fp32)."""
    after: float
    """The same with the fitted weights."""
    fit_before: float
    fit_after: float
    """The fit half's mean squared difference before and after the fit (what the steps minimised)."""
    fit_records: list[int]
    held_records: list[int]
    """Positions (in the records given) of the two halves."""
    tokens: tuple[int, int]
    """Response tokens used in the fit half and in the held-out half."""
    steps: int
    lr: float

    @property
    def fall(self) -> float:
        """``1 - after / before``: the share of the held-out mismatch a fitted weight delta removes."""
        return 1.0 - self.after / self.before if self.before > 0 else 0.0

    @property
    def named(self) -> bool:
        return self.fall >= FALL

    def to_dict(self) -> dict:
        return {"before": self.before, "after": self.after, "fall": self.fall, "threshold": FALL,
                "fit_before": self.fit_before, "fit_after": self.fit_after, "fit_records": self.fit_records,
                "held_records": self.held_records, "tokens": list(self.tokens), "steps": self.steps, "lr": self.lr,
                "named": self.named}


def _split(n: int, seed: int) -> tuple[list[int], list[int]]:
    order = np.random.default_rng(seed).permutation(n).tolist()
    return sorted(order[: n // 2]), sorted(order[n // 2:])


def _capped(records, idx, tokens) -> list[int]:
    out, used = [], 0
    for i in idx:
        if out and used + len(records[i].response_ids) > tokens:
            break
        out.append(i)
        used += len(records[i].response_ids)
    return out


def _batches(records, idx, max_tokens):
    """Micro-batches of records (rows x longest <= max_tokens, at least one record each)."""
    out, cur, longest = [], [], 0
    for i in idx:
        n = len(records[i].prompt_ids) + len(records[i].response_ids)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    return out + ([cur] if cur else [])


def _squared(model, records, idx, max_tokens, device) -> tuple[torch.Tensor, int]:
    """Sum over the tokens of ``idx`` of (log pi - log mu)^2 (a graph when grad is on), and their count."""
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for group in _batches(records, idx, max_tokens):
        recs = [records[i] for i in group]
        b = to_padded(recs, vocab_size=model.config.vocab_size)
        P = b["response_start"]
        logits = model(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device),
                       position_ids=b["position_ids"].to(device)).logits[:, P - 1: -1]
        for row, r in enumerate(recs):
            n = len(r.response_ids)
            lp = process_logits(logits[row, :n], r.temperature, r.top_k, r.top_p)
            lp = lp.gather(-1, torch.tensor(r.response_ids, device=device)[:, None]).squeeze(-1)
            mu = torch.tensor(r.logprobs, dtype=torch.float64, device=device)
            total = total + ((lp.double() - mu) ** 2).sum()
            count += n
    return total, count


def _one_fold(model, records, fit, held, steps, lr, max_tokens):
    """(held before, held after, fit before, fit after, fit tokens, held tokens) of one fit."""
    ref = copy.deepcopy(model).float()
    device = next(ref.parameters()).device
    ref.eval()
    try:
        with torch.no_grad():
            s, n_held = _squared(ref, records, held, max_tokens, device)
            before = float(s)
        opt = torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=lr)
        fit_before = None
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            s, n_fit = _squared(ref, records, fit, max_tokens, device)
            fit_before = float(s.detach()) if fit_before is None else fit_before
            (s / n_fit).backward()
            opt.step()
        with torch.no_grad():
            after = float(_squared(ref, records, held, max_tokens, device)[0])
            fit_after = float(_squared(ref, records, fit, max_tokens, device)[0])
    finally:
        del ref
    return before, after, fit_before, fit_after, n_fit, n_held


def weight_delta_test(model, records, *, steps: int = STEPS, lr: float = LR, tokens: int = TOKENS,
                      seed: int = SEED, max_tokens: int = 16384) -> WeightDelta | None:
    """The test of the module docstring on ``model`` (left unchanged) and ``records``; None for
    fewer than :data:`MIN_RECORDS` records (too few to split)."""
    for name, v in (("steps", steps), ("tokens", tokens), ("max_tokens", max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    records = list(records)
    if len(records) < MIN_RECORDS:
        return None
    a, b = _split(len(records), seed)
    a, b = _capped(records, a, tokens), _capped(records, b, tokens)
    folds = [_one_fold(model, records, a, b, steps, lr, max_tokens), _one_fold(model, records, b, a, steps, lr, max_tokens)]
    before, after, fit_before, fit_after, n_fit, n_held = (sum(f[k] for f in folds) for k in range(6))
    return WeightDelta(before / n_held, after / n_held, fit_before / n_fit, fit_after / n_fit, a, b,
                       (sum(len(records[i].response_ids) for i in a),
                        sum(len(records[i].response_ids) for i in b)), steps, float(lr))
