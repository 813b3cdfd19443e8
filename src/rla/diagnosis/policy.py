"""Which weights sampled the rollouts: the records' ``policy`` field against the checkpoint.

Rollouts sampled by the policy one optimizer step earlier (Adam, lr 1e-5) are inside the rounding
scale on the bundled model: no size test separates them from rounding, and a weight-delta fit
(``lab/diagnosis/weight_delta.py``) did not either at the sizes measured
(``results/diagnosis/weight_delta.md``). Records that carry the fingerprint of the weights that
sampled them (``policy.weights``, :mod:`rla.rollout.fingerprint`; rla's sampler and ``rla train``
write it) settle it before any forward:

- records whose fingerprints differ among themselves came from several checkpoints;
- a fingerprint that is not the checkpoint's: the rollouts came from other weights (the policy
  some steps earlier or later when ``policy.step`` says so, another checkpoint otherwise).

Either is the verdict ``stale_weights`` (``rla diagnose`` exit 3), and nothing is attributed. The
fingerprint of the checkpoint is computed from the model as given, so fp32 master weights and
their bf16 copy agree (the rule rounds its sample to bf16). Records without the field are not
checked; the report says how many carried it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rla.rollout.fingerprint import RULE, parse, weights_fingerprint

__all__ = ["PolicyCheck", "check_policy"]


@dataclass
class PolicyCheck:
    checkpoint: str
    """The checkpoint's fingerprint (:func:`rla.rollout.fingerprint.weights_fingerprint`)."""
    carried: int
    """Records with a ``policy`` field (of all records diagnosed)."""
    n_records: int
    recorded: dict[str, list[int]] = field(default_factory=dict)
    """fingerprint -> 0-based input indices of the records carrying it."""
    steps: dict[str, list[int]] = field(default_factory=dict)
    """fingerprint -> the distinct ``policy.step`` values recorded with it."""
    message: str = ""

    @property
    def stale(self) -> bool:
        return bool(self.recorded) and set(self.recorded) != {self.checkpoint}

    def mismatched(self) -> list[int]:
        """0-based input indices of the records sampled by other weights than the checkpoint's."""
        return sorted(i for fp, idx in self.recorded.items() if fp != self.checkpoint for i in idx)

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "records_with_policy": self.carried, "records": self.n_records,
                "recorded": self.recorded, "steps": self.steps, "stale": self.stale}


def _steps(steps) -> str:
    return f" (step {', '.join(map(str, steps))})" if steps else ""


def check_policy(model, records, indices) -> PolicyCheck:
    """Compare the records' ``policy.weights`` with ``model``'s fingerprint (module docstring).

    ``indices``: each record's 0-based position in the input (for the message). A fingerprint of
    another rule than this rla's (:data:`rla.rollout.fingerprint.RULE`) is a ValueError: it cannot
    be compared, and skipping it would let stale rollouts read as rounding.
    """
    recorded: dict[str, list[int]] = {}
    steps: dict[str, set[int]] = {}
    for r, i in zip(records, indices):
        if r.policy is None:
            continue
        fp = r.policy["weights"]
        rule, _ = parse(fp)
        if rule != RULE:
            raise ValueError(f"record {i}, field 'policy': its weights fingerprint is of rule {rule!r}; this rla "
                             f"computes {RULE!r} and cannot compare the two. Use the rla that wrote the records, or "
                             "drop the field to diagnose without the check.")
        recorded.setdefault(fp, []).append(i)
        if "step" in r.policy:
            steps.setdefault(fp, set()).add(r.policy["step"])
    check = PolicyCheck(weights_fingerprint(model), sum(len(v) for v in recorded.values()), len(records), recorded,
                        {fp: sorted(s) for fp, s in steps.items()})
    if not check.stale:
        return check
    ours = check.recorded.get(check.checkpoint, [])
    others = {fp: idx for fp, idx in recorded.items() if fp != check.checkpoint}
    said = "; ".join(f"{fp}{_steps(check.steps.get(fp))}: {len(idx)} record(s), first {idx[0]}"
                     for fp, idx in others.items())
    mixed = (f" The records come from {len(recorded)} different weights: rollouts of several checkpoints mixed in one "
             "file." if len(recorded) > 1 else "")
    check.message = (
        f"The rollouts were sampled by other weights than this checkpoint's: {check.carried} of {len(records)} records "
        f"say which weights sampled them (policy.weights), and {len(check.mismatched())} name weights whose fingerprint "
        f"is not the checkpoint's {check.checkpoint} ({said}; {len(ours)} match it).{mixed} Rollouts of stale weights "
        "(the policy an optimizer step or more earlier) look like rounding to every size test, so nothing is attributed: "
        "diagnose the checkpoint that sampled them, or sample again with these weights.")
    if any(p.dtype == torch.float16 for p in model.parameters()):
        check.message += (" (The checkpoint is loaded in fp16: weights below fp16's normal range (6.1e-5) round "
                          "there first and can change the fingerprint; load it as the sampler held it, e.g. "
                          "--dtype bf16, to rule that out.)")
    return check
