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
their bf16 copy agree (the rule rounds its sample to bf16).

Records without the field cannot be checked, and then a mismatch of rounding's size is not called
rounding: the evidence a "rounding" verdict cites (k3 against a scale, the attribution) is measured
on these rollouts, which stale weights distort by no more than rounding does (:data:`MEASURED`).
The verdict is ``rounding_weights_unverified`` instead (:meth:`PolicyCheck.unverified`: the
attribution is shown, conditional on these weights having sampled the records).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rla.rollout.fingerprint import RULE, parse, weights_fingerprint

__all__ = ["PolicyCheck", "check_policy", "MEASURED", "MEASURED_IN"]

MEASURED = {
    "rounding_k3_over_scale": (0.0014, 0.27),
    "stale_k3_over_scale": (0.10, 1.2),
    "rounding_fall_max": 0.46,
    "stale_fall_min": -0.037,
}
"""The overlap that makes records without a ``policy`` field unverifiable, as measured on the
bundled model (10 records x 32 tokens, seeds 0-4; :data:`MEASURED_IN`): k3 over the rounding
scale of true rounding (rla's sampler under the vllm and sglang profiles on the checkpoint's own
weights) and of rollouts of the policy one Adam step (lr 1e-5) earlier, and the held-out fall of
a fitted weight delta (``lab/diagnosis/weight_delta.py``), whose largest under rounding is above
its smallest under stale weights. Two significant digits of the results files, which a test reads."""
MEASURED_IN = "results/diagnosis/weight_delta.md"


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

    @property
    def verified(self) -> bool:
        """Every record names the weights that sampled it, and they are the checkpoint's."""
        return self.carried == self.n_records and not self.stale

    def unverified(self) -> str | None:
        """Why a mismatch of rounding's size cannot be called rounding here (None when
        :attr:`verified`): the records do not say which weights sampled them."""
        if self.verified or self.stale:
            return None
        m = MEASURED
        (r0, r1), (s0, s1) = m["rounding_k3_over_scale"], m["stale_k3_over_scale"]
        said = (f"none of the {self.n_records} records carries a `policy` fingerprint" if not self.carried else
                f"{self.n_records - self.carried} of the {self.n_records} records carry no `policy` fingerprint (the "
                f"{self.carried} that do name this checkpoint's, {self.checkpoint})")
        return (
            f"But the records do not say which weights sampled them: {said}, so rollouts of a policy a few optimizer steps stale cannot be told apart from "
            f"rounding here. Their mismatch is of rounding's size too: on the bundled model, rollouts of the policy "
            f"one Adam step (lr 1e-5) earlier measured {s0:g}-{s1:g}x the rounding scale and true rounding "
            f"{r0:g}-{r1:g}x, and a fitted weight delta's held-out fall overlapped as well (rounding up to "
            f"{m['rounding_fall_max']:+g}, stale down to {m['stale_fall_min']:+g}; {MEASURED_IN}). The attribution "
            "and profile detection hold only if these weights sampled the records. To check it, record the "
            "weights' fingerprint with each rollout (field `policy`, docs/rollouts.md): rla's sampler and "
            "`rla train` write it; in your own loop, `rla.rollout.fingerprint.weights_fingerprint(model)` at each "
            "weight sync; with TRL, `rla.integrations.trl.attach(trainer, log_tokens=True)` writes it into the "
            "completions table (`rla/policy`).")

    def mismatched(self) -> list[int]:
        """0-based input indices of the records sampled by other weights than the checkpoint's."""
        return sorted(i for fp, idx in self.recorded.items() if fp != self.checkpoint for i in idx)

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "records_with_policy": self.carried, "records": self.n_records,
                "recorded": self.recorded, "steps": self.steps, "stale": self.stale, "verified": self.verified}


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
