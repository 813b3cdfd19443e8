"""The full-vocabulary comparison of records that carry the engine's distribution (``top_logprobs``).

:func:`vocab_kl_of_records` scores each such record with the model (the trainer's side), takes the
trainer's whole processed distribution at every response position, and hands
:func:`rla.metrics.vocab_kl` the engine's listed logprobs, the trainer's logprobs of the same
tokens and the trainer's mass on every other token: KL(engine || trainer), exact where the
record's lists are complete, a lower bound where they are the engine's top k (that function says
which bound). Records without the field are not scored and not counted.

Numerics. The trainer's distribution is the fp32 log-softmax of the processed logits (temperature,
top-k / top-p as the record says, :func:`rla.rollout.sampling.process_logits`, what
``rla.logprobs`` computes), taken to fp64 and renormalised there, so the listed logprobs and the
tail's log-mass (a log-sum-exp over the unlisted tokens) come from one distribution that sums to 1
in fp64. Records whose ``metadata["logprobs_mode"]`` is ``raw_logprobs`` are compared at
temperature 1 without filters (what the engine listed). One record at a time, ``chunk`` response
positions through the LM head at once.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["vocab_kl_of_records", "vocab_summary", "vocab_line"]


@torch.inference_mode()
def vocab_kl_of_records(model, records, chunk: int = 256) -> dict | None:
    """``rla.metrics.vocab_kl``'s result over every response token of the records that carry
    ``top_logprobs`` (plus ``vocab_kl/records``), or None when none does."""
    from rla.metrics import vocab_kl
    from rla.rollout.sampling import process_logits
    from rla.rollout.train_logprobs import decoder_and_head

    decoder, head = decoder_and_head(model)
    device = next(model.parameters()).device
    eng, tr, tails, full, used = [], [], [], [], 0
    vocab = model.config.vocab_size
    for n, r in enumerate(records):  # every record checked before the first forward
        top = getattr(r, "top_logprobs", None)
        worst = max((i for pairs in top["response"] for i, _ in pairs), default=-1) if top else -1
        if worst >= vocab:
            raise ValueError(f"record {n}: top_logprobs lists token {worst}, outside the model's vocabulary [0, {vocab})")
    for r in records:
        top = getattr(r, "top_logprobs", None)
        if not top:
            continue
        used += 1
        raw = (r.metadata or {}).get("logprobs_mode") == "raw_logprobs"
        t, k, p = (1.0, -1, 1.0) if raw else (r.temperature, r.top_k, r.top_p)
        ids = torch.tensor([list(r.prompt_ids) + list(r.response_ids)], device=device)
        P, n = len(r.prompt_ids), len(r.response_ids)
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, P - 1:P - 1 + n]
        for s in range(0, n, chunk):
            logp = process_logits(head(hidden[s:s + chunk]), t, k, p).double().cpu()
            logp = logp - torch.logsumexp(logp, -1, keepdim=True)
            for j, row in enumerate(logp, start=s):
                pairs = top["response"][j]
                listed = torch.tensor([i for i, _ in pairs])
                rest = torch.ones(row.shape[0], dtype=torch.bool)
                rest[listed] = False
                eng.append(np.array([lp for _, lp in pairs], dtype=np.float64))
                tr.append(row[listed].numpy())
                tails.append(float(torch.logsumexp(row[rest], 0)) if rest.any() else -math.inf)
                full.append(bool(top["complete"]))
    if not used:
        return None
    out = vocab_kl(eng, tr, tails, full)
    out["vocab_kl/records"] = used
    return out


def vocab_summary(result: dict | None) -> dict | None:
    """The result without its per-token list (for a report's JSON)."""
    return None if result is None else {k: v for k, v in result.items() if k != "vocab_kl/per_token"}


def vocab_line(result: dict | None) -> str | None:
    """One sentence for a report, saying whether the value is the KL or a lower bound on it."""
    if result is None:
        return None
    what = ("exact (the records list the engine's whole distribution)" if result["vocab_kl/kind"] == "exact" else
            "a lower bound (top-k lists: the unlisted tokens merged into one outcome; the KL itself may be larger)")
    return (f"Full-vocabulary KL(engine || trainer): mean {result['vocab_kl/mean']:.3g}, max {result['vocab_kl/max']:.3g} "
            f"over {result['vocab_kl/tokens']} tokens of {result['vocab_kl/records']} records carrying top_logprobs; {what}.")
