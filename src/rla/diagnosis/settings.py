"""The records' sampling settings, checked on a yardstick the records cannot move.

The rounding scale of :mod:`.scale` is measured at the records' own temperature and top-k /
top-p, so a record that lies about them moves its own yardstick: rollouts sampled at temperature
1 but recorded as 0.01 are scored at ``logits / 0.01``, where rounding is 100 times larger, and
their k3 of about 2 looked "within what rounding produces". This check runs first, on inputs the
records' settings cannot touch:

- the **fixed-settings scale**: the same measurement as :mod:`.scale` (every profile's fully
  aligned bf16 forward against the fp32 forward of the same weights) at temperature 1 with no
  top-k / top-p, whatever the records say;
- the **raw fit**: the fp32 forward at those fixed settings against the recorded logprobs.

Two contradictions are named before any attribution:

- *the logprobs fit the fixed settings, not the recorded ones*: the records' settings are not
  1 / none, the fp32 forward at temperature 1 without top-k / top-p explains the logprobs within
  ``FAR`` times the fixed-settings scale, and the fp32 forward at the recorded settings does not
  (k3 beyond ``FAR`` times that scale and ``FAR`` times the raw fit's): a temperature or top-k /
  top-p in the records that the logprobs were not computed with (or raw logprobs recorded);
- *truncated logprobs recorded as unfiltered*: the records say temperature 1 without top-k /
  top-p, but at least :data:`TRUNCATED_SHARE` of their tokens have a logprob of exactly 0.0
  where this model's fp32 forward at those settings gives a surprisal ``-log pi`` of at least
  :data:`rla.diagnosis.temperature.FLOOR` (1e-5). A logprob of exactly 0 over an unfiltered
  vocabulary needs the rest of it below fp32's resolution near 1 (about 6e-8); rounding moves a
  surprisal by a few percent, not from 1e-5 to 0. Top-p / top-k that keep one token give
  exactly 0 (the kept token renormalised): the rollouts were sampled with a top-p / top-k the
  records do not carry. (A top-k or top-p that keeps several tokens raises each kept logprob by
  ``-log Z`` and is not named by this test; on the bundled model top-p 0.8-0.95 keeps one token
  for 97-99% of tokens.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

import rla.metrics as M
from rla.diagnosis.passes import forward_pass
from rla.diagnosis.scale import FAR, RoundingScale, fp32_reference, rounding_scale
from rla.diagnosis.temperature import FLOOR

__all__ = ["SettingsCheck", "check_settings", "fixed", "TRUNCATED_SHARE"]

TRUNCATED_SHARE = 0.05
"""Truncated logprobs are named when at least this share of the tokens are exactly 0.0 where the
fp32 forward gives a surprisal of at least :data:`rla.diagnosis.temperature.FLOOR`."""


def fixed(records) -> list:
    """The records at the fixed settings: temperature 1, no top-k, no top-p."""
    return [dataclasses.replace(r, temperature=1.0, top_k=-1, top_p=1.0) for r in records]


def _is_fixed(r) -> bool:
    return r.temperature == 1.0 and r.top_p == 1.0 and r.top_k in (-1, 0)


@dataclass
class SettingsCheck:
    scale: RoundingScale
    """The rounding scale at the fixed settings (module docstring): the records' settings cannot move it."""
    k3_fixed: float
    """k3 of the fp32 forward at the fixed settings against the recorded logprobs."""
    k3_recorded: float
    """k3 of the fp32 forward at the recorded settings against the recorded logprobs."""
    truncated: float
    """Share of tokens whose recorded logprob is exactly 0.0 where the fp32 forward at the fixed
    settings gives a surprisal of at least FLOOR."""
    cause: str | None
    """None, "raw_logprobs" (the logprobs fit the fixed settings, not the recorded ones) or
    "top_p_top_k" (top-k / top-p applied, recorded as unfiltered)."""
    message: str
    settings: tuple = ()
    """The distinct recorded (temperature, top_p, top_k)."""

    def to_dict(self) -> dict:
        return {"scale_at_fixed_settings": self.scale.to_dict(), "k3_fixed": self.k3_fixed,
                "k3_recorded": self.k3_recorded, "truncated": self.truncated, "cause": self.cause, "settings": [list(s) for s in self.settings]}


def check_settings(model, records, groups, reference, by_group, mu, mask, sizes, bar=None) -> SettingsCheck:
    """The check of the module docstring. ``groups``: the profile groups (tuples of profiles);
    ``reference`` / ``by_group``: the fp32 and each group's fully aligned forwards at the recorded
    settings (group names -> [B, R]), reused when every record is at the fixed settings."""
    if all(_is_fixed(r) for r in records):
        ref_fixed, by_fixed = reference, by_group
    else:
        plain = fixed(records)
        ref_fixed = fp32_reference(model, plain, sizes, bar)
        by_fixed = {tuple(p.name for p in g): forward_pass(model, plain, g[0], ("rope", "swiglu", "rmsnorm"), sizes,
                                                           bar, "fixed settings, all aligned") for g in groups}
    scale = rounding_scale(ref_fixed, {" = ".join(g): v for g, v in by_fixed.items()}, mask)
    k3_fixed = M.mismatch(ref_fixed, mu, mask)["mismatch/k3"]
    k3_rec = M.mismatch(reference, mu, mask)["mismatch/k3"]
    zero = (mu == 0.0) & (-ref_fixed >= FLOOR) & mask
    truncated = float(zero.sum() / mask.sum())
    settings = tuple(sorted({(float(r.temperature), float(r.top_p), int(r.top_k)) for r in records}))
    said = "; ".join(f"temperature {t:g}, top_p {p:g}, top_k {k}" for t, p, k in settings)
    bound = FAR * scale.k3
    cause, message = None, ""
    if (not all(_is_fixed(r) for r in records) and k3_fixed <= bound and k3_rec > bound
            and k3_rec > FAR * k3_fixed):
        cause = "raw_logprobs"
        message = (
            f"The recorded logprobs fit temperature 1 without top-k / top-p, not the recorded settings ({said}): "
            f"this model's fp32 forward at temperature 1 leaves k3 = {k3_fixed:.3e} against them, within {FAR:g}x "
            f"the rounding scale measured at those fixed settings ({scale.k3:.3e}, every profile's bf16 forward "
            f"against the fp32 forward; the records' settings cannot move it), and at the recorded settings "
            f"k3 = {k3_rec:.3e} ({k3_rec / max(scale.k3, 1e-300):.3g}x that scale). The records carry settings the "
            "logprobs were not computed with: a wrong temperature / top-k / top-p in the records, or raw logprobs "
            "recorded (vLLM: LLM(..., logprobs_mode='processed_logprobs'); SGLang: leave "
            "SGLANG_RETURN_ORIGINAL_LOGPROB unset).")
    elif all(_is_fixed(r) for r in records) and truncated >= TRUNCATED_SHARE:
        cause = "top_p_top_k"
        message = (
            f"The records say temperature 1 without top-k / top-p ({said}), but {int(zero.sum())} of "
            f"{int(mask.sum())} tokens ({truncated:.1%}) have a logprob of exactly 0.0 where this model's fp32 forward at "
            f"those settings gives them a surprisal of at least {FLOOR:g} nats (median "
            f"{float(np.median(-ref_fixed[zero])):.3g}). Over an unfiltered vocabulary a logprob of exactly 0 needs "
            "the rest below fp32's resolution (about 6e-8), and rounding moves a surprisal by a few percent; a top-p / "
            "top-k that kept only that token gives exactly 0. The rollouts were likely sampled with top_p < 1 or "
            "top_k > 0 that the records do not carry: record the settings they were sampled with.")
    return SettingsCheck(scale, k3_fixed, k3_rec, truncated, cause, message, settings)
