"""The verdict: is the mismatch rounding (then attribute it), or something rounding cannot produce?

Given the rounding scale (:mod:`.scale`) and the fully aligned forward under every profile:

1. **Beyond rounding.** The best profile's k3 against the rollouts is more than ``FAR`` times the
   scale, or single sequences are beyond ``FAR`` times their own scale. Then the worst of them
   (at most ``TESTED``) are re-scored under hypotheses of what went wrong, cheapest first:

   - *raw logprobs*: the records' sampling settings are not 1/none, and the logprobs fit the raw
     distribution (temperature 1, no top-k/top-p): the engine returned raw logprobs;
   - *temperature*: the logprobs fit another temperature from :data:`TEMPERATURES`;
   - *corrupt logprobs*: on average the rollout logprobs are below the model's,
     ``mean(log mu - log pi) < 0`` beyond three standard errors. A sampler's own logprobs of its
     own samples cannot be: ``E_mu[log mu - log pi] = KL(mu || pi) >= 0``;
   - otherwise *a different model*: the tokens are less likely under this model than under the
     policy that sampled them (KL > 0), by far more than rounding: another checkpoint, an unmerged
     LoRA, another tokenizer or chat template.

   A hypothesis fits a sequence when it brings its k3 under the sequence's bound. When the
   temperature fit (:mod:`.temperature`) could be made, it replaces the temperature grid: the
   temperature is named when the fit is far from the records' and brings k3 within rounding's
   size, and not otherwise (a different model's sequences can each fit another grid temperature).
2. **A temperature that rounding's size hides.** The mismatch is within rounding's size, but the
   temperature the recorded logprobs fit (:mod:`.temperature`, on the scale ``log(-log p)``) is
   farther from the records' than rounding moves that fit on these sequences, and explains them
   better: a wrong temperature, or raw logprobs when the fit is temperature 1. Also
   "beyond_rounding": rounding cannot produce it, in shape rather than in size.
3. **The profile makes it worse.** Aligning every region to the diagnosed profile raises k3: the
   rollouts were not sampled under it. The verdict names the profile that fits best.
4. **Rounding.** Otherwise the attribution stands, and the verdict is ``rounding`` when every record
   names the weights that sampled it and they are the checkpoint's (:mod:`.policy`). When the
   records do not say (``weights``: the reason, :meth:`rla.diagnosis.policy.PolicyCheck.unverified`),
   the verdict is ``rounding_weights_unverified``: the mismatch is of rounding's size, but so is
   that of rollouts a few optimizer steps stale, and everything measured here is measured on the
   rollouts themselves, so it cannot tell the two apart. The attribution is still given, as
   holding only if these weights sampled the records (``attributed``, not ``ok``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from rla.diagnosis.passes import forward_pass, per_sequence_k3
from rla.diagnosis.scale import FAR, RoundingScale

__all__ = ["Verdict", "judge", "TEMPERATURES", "TESTED"]

TEMPERATURES = (0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
TESTED = 8
"""Sequences re-scored under each hypothesis (the worst ones): a bounded cost on any input."""


@dataclass
class Verdict:
    kind: str
    """"rounding" (attribution stands), "rounding_weights_unverified" (rounding-sized, the attribution
    holds if the weights the records do not name are the checkpoint's), "profile_increases", or
    "beyond_rounding"."""
    cause: str | None
    """None, "wrong_profile", "raw_logprobs", "temperature", "corrupt_logprobs", "different_model",
    "stale_weights" (:mod:`.policy`) or a cause of the settings check (:mod:`.settings`)."""
    message: str
    ratio: float | None
    """k3 of the best-fitting profile against the rollouts, over the rounding scale; None when the
    verdict came before any forward (``stale_weights``)."""
    flagged: list[int] = field(default_factory=list)
    """0-based input indices of the sequences beyond rounding."""
    temperature: dict | None = None
    """The temperature fit (:class:`rla.diagnosis.temperature.TemperatureFit`), as a dict; None when
    it was not made."""

    @property
    def ok(self) -> bool:
        """Rounding, with the weights that sampled the records checked: the attribution stands."""
        return self.kind == "rounding"

    @property
    def attributed(self) -> bool:
        """The attribution is given: it stands (``ok``), or holds if the unverified weights are the
        checkpoint's (``rounding_weights_unverified``)."""
        return self.kind in ("rounding", "rounding_weights_unverified")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"ok": self.ok, "attributed": self.attributed}


def _fits(model, records, sub, mu, mask, bound, sizes, bar, change, what):
    recs = [dataclasses.replace(records[i], **change(records[i])) for i in sub]
    pi = forward_pass(model, recs, None, (), sizes, bar, what)
    k3 = per_sequence_k3(pi, mu[sub][:, : pi.shape[1]], mask[sub][:, : pi.shape[1]])
    return k3, k3 <= bound[sub]


def _fit_text(tfit) -> str:
    said = "; ".join(f"recorded {t:g}, fits {t * tfit.factor:.3g}" for t in tfit.temperatures)
    edge = " (at the edge of the factors tried, 1/4 to 4: at least that far)" if tfit.at_edge else ""
    return (f"fitted on {tfit.tokens} tokens of {tfit.sequences} sequences, the recorded logprobs are those of "
            f"{tfit.factor:.3g}x the recorded temperature ({said}){edge}; on the scale log(-log p), where a temperature "
            f"error moves every token the same way, rounding alone moves that fit by at most {tfit.rounding_moves:.2%} "
            f"on these sequences (every profile's bf16 forward against the fp32 forward); this is "
            f"{abs(tfit.factor - 1):.1%}, and at the fitted temperature k3 falls from {tfit.k3_record:.3e} to "
            f"{tfit.k3_fit:.3e}")


def _temperature_shape(tfit, best_k3, ratio, scale) -> Verdict:
    """A temperature that rounding's size hides and its shape does not (:mod:`.temperature`)."""
    head = (
        f"The mismatch is within rounding's size (k3 {best_k3:.3e}, {ratio:.2g}x the rounding scale {scale.k3:.3e}) but "
        f"not rounding's shape: {_fit_text(tfit)}. It is not attributed to regions. "
    )
    temps = tfit.temperatures
    if all(t != 1.0 for t in temps) and all(abs(np.log(t * tfit.factor)) <= tfit.threshold for t in temps):
        return Verdict("beyond_rounding", "raw_logprobs", head + (
            "Likely cause: raw logprobs. They fit temperature 1 (no temperature applied), not the recorded sampling "
            "settings. Record processed logprobs (vLLM: LLM(..., logprobs_mode='processed_logprobs'); SGLang: leave "
            "SGLANG_RETURN_ORIGINAL_LOGPROB unset), or record the settings the logprobs were computed with."),
            ratio, tfit.flagged())
    return Verdict("beyond_rounding", "temperature", head + (
        "Likely cause: a wrong temperature in the records: they do not carry the temperature the tokens were sampled "
        "and scored with."), ratio, tfit.flagged())


def _beyond(model, records, indices, mu, mask, scale, best_pi, best_k3, ratio, flagged, sizes, bar,
            tfit=None) -> Verdict:
    bound = scale.bound()
    seq_best = np.min(best_pi, axis=0)
    order = flagged[np.argsort(-(seq_best[flagged] / bound[flagged]))]
    sub = order[:TESTED]
    shown = ", ".join(str(indices[i]) for i in order[:10]) + (", ..." if len(order) > 10 else "")
    head = (
        f"The mismatch is far beyond rounding: the best-fitting profile leaves k3 = {best_k3:.3e}, "
        f"{ratio:.3g}x the rounding scale {scale.k3:.3e} (the largest k3 between this model's bf16 forward under "
        f"any profile and its fp32 forward; two rounding stacks differ by at most about 4x that), and "
        f"{len(flagged)} of {len(records)} sequences are beyond {FAR:g}x their own scale (records {shown}; 0-based). "
        "It is not attributed to regions. "
    )
    n = len(sub)
    raw = [i for i in sub if (records[i].temperature, records[i].top_k, records[i].top_p) != (1.0, -1, 1.0)]
    if raw:
        _, ok = _fits(model, records, np.array(raw), mu, mask, bound, sizes, bar,
                      lambda r: dict(temperature=1.0, top_k=-1, top_p=1.0), "raw-logprob hypothesis")
        if ok.sum() * 2 > len(raw):
            return Verdict("beyond_rounding", "raw_logprobs", head + (
                f"Likely cause: raw logprobs. In {int(ok.sum())} of {len(raw)} tested sequences the logprobs fit the raw "
                "distribution (temperature 1, no top-k/top-p), not the recorded sampling settings. Record processed "
                "logprobs (vLLM: LLM(..., logprobs_mode='processed_logprobs'); SGLang: leave "
                "SGLANG_RETURN_ORIGINAL_LOGPROB unset), or record the settings the logprobs were computed with."),
                ratio, [indices[i] for i in order])
    if tfit is not None:  # the set-level fit (.temperature) decides; the grid below is for too few tokens
        if tfit.far and tfit.k3_fit <= FAR * scale.k3:
            return Verdict("beyond_rounding", "temperature", head + (
                f"Likely cause: a wrong temperature in the records: {_fit_text(tfit)}. The records do not carry the "
                "temperature the tokens were sampled and scored with."), ratio, [indices[i] for i in order])
        return _corrupt_or_other(model, records, indices, mu, mask, sub, order, head, ratio, sizes, bar)
    k3s = []
    for t in TEMPERATURES:
        k3, _ = _fits(model, records, sub, mu, mask, bound, sizes, bar, lambda r, t=t: dict(temperature=t),
                      f"temperature {t} hypothesis")
        k3s.append(k3)
    k3s = np.array(k3s)  # [T, n]
    best_t = np.array(TEMPERATURES)[k3s.argmin(axis=0)]
    fit = k3s.min(axis=0) <= bound[sub]
    moved = fit & (best_t != np.array([records[i].temperature for i in sub]))
    if moved.sum() * 2 > n:
        pairs = sorted({(records[i].temperature, float(best_t[j])) for j, i in enumerate(sub) if moved[j]})
        said = "; ".join(f"recorded {a:g}, fits {b:g}" for a, b in pairs)
        return Verdict("beyond_rounding", "temperature", head + (
            f"Likely cause: a wrong temperature in the records. {int(moved.sum())} of {n} tested sequences fit another "
            f"temperature ({said}; grid {', '.join(f'{t:g}' for t in TEMPERATURES)}): the records do not carry the "
            "temperature the tokens were sampled and scored with."), ratio, [indices[i] for i in order])
    return _corrupt_or_other(model, records, indices, mu, mask, sub, order, head, ratio, sizes, bar)


def _corrupt_or_other(model, records, indices, mu, mask, sub, order, head, ratio, sizes, bar) -> Verdict:
    pi = forward_pass(model, [records[i] for i in sub], None, (), sizes, bar, "model logprobs")
    m = mask[sub][:, : pi.shape[1]]
    d = (mu[sub][:, : pi.shape[1]] - pi)[m]
    k1, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("inf")
    if k1 < -3 * se:
        return Verdict("beyond_rounding", "corrupt_logprobs", head + (
            f"Likely cause: corrupt rollout logprobs. In the tested sequences they are {-k1:.3g} nats per token below this "
            f"model's ({abs(k1) / se:.0f} standard errors); a sampler's own logprobs of its own samples cannot be lower on "
            "average (E[log mu - log pi] = KL(mu || pi) >= 0). Check the logprob field: placeholders, another field, "
            "or shifted by one token."), ratio, [indices[i] for i in order])
    return Verdict("beyond_rounding", "different_model", head + (
        f"Likely cause: a different model. The sampled tokens are less likely under this model than under the policy that "
        f"sampled them (KL ~ {k1:.3g} nats per token in the tested sequences), and no temperature or logprob mode explains "
        "it: the rollouts likely come from another checkpoint (an older policy, an unmerged LoRA adapter, another "
        "tokenizer or chat template)."), ratio, [indices[i] for i in order])


def judge(model, records, indices, mu, mask, scale: RoundingScale, by_profile: dict[str, np.ndarray],
          profile_name: str, seq_none: np.ndarray, seq_all: np.ndarray, regions=("rope", "swiglu", "rmsnorm"), *,
          sizes, bar=None, temperature=None, weights: str | None = None) -> Verdict:
    """The verdict (module docstring). ``by_profile``: group label -> fully aligned logprobs [B, R];
    ``seq_none`` / ``seq_all``: per-sequence k3 with no region / all diagnosed ``regions`` aligned;
    ``temperature``: the :class:`~rla.diagnosis.temperature.TemperatureFit` of these records (None when
    it was not made); ``weights``: why the weights that sampled the records are not verified (None:
    they are the checkpoint's), which turns ``rounding`` into ``rounding_weights_unverified``."""
    labels = list(by_profile)
    k3_by = {lab: float(np.sum(per_sequence_k3(by_profile[lab], mu, mask) * mask.sum(1)) / mask.sum()) for lab in labels}
    best_label = min(k3_by, key=k3_by.get)
    best_k3 = k3_by[best_label]
    ratio = best_k3 / scale.k3 if scale.k3 > 0 else float("inf")
    tfit = temperature
    fitted = None if tfit is None else tfit.to_dict()
    per_seq = np.array([per_sequence_k3(by_profile[lab], mu, mask) for lab in labels])
    flagged = np.flatnonzero(per_seq.min(axis=0) > scale.bound())
    if ratio > FAR and flagged.size == 0:
        flagged = np.argsort(-per_seq.min(axis=0))[:TESTED]
    if flagged.size:
        v = _beyond(model, records, indices, mu, mask, scale, per_seq, best_k3, ratio, flagged, sizes, bar, tfit)
        return dataclasses.replace(v, temperature=fitted)
    if tfit is not None and tfit.far:
        return dataclasses.replace(_temperature_shape(tfit, best_k3, ratio, scale), temperature=fitted)
    w = mask.sum(1)
    k3_none, k3_all = float(seq_none @ w / w.sum()), float(seq_all @ w / w.sum())
    diff = seq_all - seq_none
    se = diff.std(ddof=1) / np.sqrt(diff.size) if diff.size > 1 else float("inf")
    if k3_all > k3_none and diff.mean() > 2 * se:  # an increase beyond two standard errors, not noise
        return Verdict("profile_increases", "wrong_profile", (
            f"Aligning {'+'.join(regions)} to {profile_name} increases the mismatch: k3 {k3_none:.3e} -> {k3_all:.3e} "
            f"({k3_all / k3_none:.3g}x, {diff.mean() / se:.1f} standard errors over {diff.size} sequences). The rollouts were likely not sampled under {profile_name}; {best_label} fits "
            f"them best (k3 {best_k3:.3e} with all regions aligned). Rerun with that profile or --profile auto."), ratio,
            temperature=fitted)
    if tfit is None:
        fit_note = ""
    elif abs(np.log(tfit.factor)) <= tfit.threshold:
        fit_note = (f" The recorded logprobs fit the recorded temperature (fitted factor {tfit.factor:.4f}; rounding "
                    f"moves it by up to {tfit.rounding_moves:.2%} here).")
    else:
        fit_note = (f" The recorded logprobs fit {tfit.factor:.4f}x the recorded temperature, but that temperature does "
                    f"not explain them better (k3 {tfit.k3_record:.3e} at theirs, {tfit.k3_fit:.3e} at the fit), so "
                    "it is not called a wrong temperature.")
    size = (f"k3 {best_k3:.3e} with the best-fitting profile, {ratio:.2g}x the rounding scale {scale.k3:.3e} (the "
            "largest k3 between this model's bf16 forward under any profile and its fp32 forward)")
    if weights is not None:
        return Verdict("rounding_weights_unverified", None, (
            f"The mismatch is of rounding's size: {size}.{fit_note} {weights}"), ratio, temperature=fitted)
    return Verdict("rounding", None, f"The mismatch is within what rounding produces: {size}.{fit_note}", ratio,
                   temperature=fitted)
