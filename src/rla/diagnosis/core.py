"""Diagnosis: which region explains how much of the train/rollout mismatch, once it is rounding.

Order of work, cheapest refusal first:

1. The records are checked against the model (:mod:`.inputs`): positions past
   ``max_position_embeddings``, a temperature below 1e-5 and an ``engine`` field naming another
   engine than the profile's row are refused, exact duplicates counted once. Records that say
   which weights sampled them (``policy``) are compared with the checkpoint (:mod:`.policy`):
   other weights are the verdict ``stale_weights``, before any forward. Records that do not say
   cannot get the verdict ``rounding`` (step 3: ``rounding_weights_unverified``).
2. The fully aligned forward under every known profile and an fp32 forward of the same weights
   give the rounding scale (:mod:`.scale`) and, for free, the profile detection.
   The records' sampling settings are checked on a scale measured at fixed settings
   (:mod:`.settings`: temperature 1, no top-k / top-p), which the records cannot move; a
   contradiction is the verdict, before any attribution.
3. The verdict (:mod:`.verdict`): a mismatch far beyond the scale is explained by what is wrong with
   the input (raw logprobs, a wrong temperature, corrupt logprobs, a different model), a profile
   that increases the mismatch is said to, and only otherwise is the mismatch attributed.
4. For every subset of the regions (eight training forwards for three regions) the model is aligned
   to the profile in that subset only, its logprobs of the recorded tokens are computed
   (:func:`rla.logprobs`, batched and memory bounded) and compared with the rollout logprobs. The
   docs/metrics.md metrics of each subset give the attribution (:mod:`.attribution`), the share that full
   alignment leaves unexplained, per-position curves and by-probability strata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

import rla.metrics as M
from rla.diagnosis.attribution import shapley, subsets
from rla.diagnosis.inputs import check_engine, check_records
from rla.diagnosis.passes import Sizes, forward_pass, per_sequence_k3
from rla.diagnosis.policy import PolicyCheck, check_policy
from rla.diagnosis.vocab import vocab_kl_of_records, vocab_summary
from rla.progress import Progress
from rla.diagnosis.scale import RoundingScale, fp32_reference, rounding_scale
from rla.diagnosis.settings import SettingsCheck, check_settings
from rla.diagnosis.temperature import FACTORS, ONE, fit_rows, fit_temperature
from rla.diagnosis.verdict import Verdict, judge
from rla.profiles import REGIONS, RoundingProfile, for_engine, names as profile_names, get as get_profile, resolve

__all__ = ["Diagnosis", "Detection", "diagnose", "detect_profile", "subset_label", "MIN_DETECT_SEQUENCES"]

ATTRIBUTED = ("mismatch/k3", "mismatch/abs/mean")

MIN_DETECT_SEQUENCES = 8
"""Detection is not called on fewer distinct sequences: the standard error of a per-sequence
k3 difference from fewer is itself too uncertain to trust a two-standard-error rule."""


def subset_label(s, regions=REGIONS) -> str:
    """``none``, ``all`` (every diagnosed region), or the regions joined by ``+``."""
    s = tuple(s)
    if not s:
        return "none"
    if len(s) == len(regions) and set(s) == set(regions):
        return "all"
    return "+".join(s)


def group_label(group) -> str:
    """Display name of a group of profiles with identical rounding: ``"sglang = rla"``."""
    return " = ".join(group)


@dataclass
class Detection:
    """Which profile's rounding explains the rollouts best, as data."""

    ranking: list[tuple[tuple[str, ...], float]]
    """(group of profiles with identical rounding, k3 with all regions aligned to it), best first."""
    best: tuple[str, ...]
    """The lowest-k3 group: profiles in it round identically and cannot be told apart."""
    called: bool
    """True when ``best`` beats the second by more than two standard errors over at least
    :data:`MIN_DETECT_SEQUENCES` distinct sequences."""
    z: float
    """How many standard errors of the per-sequence k3 difference separate best from second."""
    n_sequences: int
    note: str

    @property
    def too_close(self) -> bool:
        return not self.called

    @property
    def best_label(self) -> str:
        return group_label(self.best)

    def to_dict(self) -> dict:
        return {
            "ranking": [{"profiles": list(g), "k3": k3} for g, k3 in self.ranking],
            "best": list(self.best),
            "called": self.called,
            "z": self.z,
            "n_sequences": self.n_sequences,
            "note": self.note,
        }


@dataclass
class Diagnosis:
    profile: str
    regions: tuple[str, ...]
    n_sequences: int
    """Distinct sequences used (exact duplicates counted once)."""
    n_tokens: int
    metrics: dict[str, dict[str, float]]
    """subset label -> docs/metrics.md metrics of the training forward with that subset aligned."""
    attribution: dict[str, dict[str, float]]
    """metric -> region -> Shapley value (mismatch removed by aligning that region)."""
    unexplained: dict[str, float]
    """metric -> m(all) / m(none): the share of the mismatch left with every region aligned."""
    per_position: dict[str, list[tuple[float, float]]]
    """subset label -> [(bin centre position, mean |delta|)]."""
    deltas: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    """subset label -> flat delta = log pi - log mu of every response token (for plots)."""
    detection: Detection | None = None
    verdict: Verdict | None = None
    scale: RoundingScale | None = None
    settings: SettingsCheck | None = None
    """The records' sampling settings checked at fixed settings (:mod:`.settings`), before the verdict."""
    policy: PolicyCheck | None = None
    """The records' ``policy`` fingerprints against the checkpoint's (:mod:`.policy`)."""
    n_input: int = 0
    """Records given, duplicates included."""
    duplicates: int = 0
    input_notes: list[str] = field(default_factory=list)
    long_inputs: dict | None = None
    vocab: dict | None = None
    """``rla.metrics.vocab_kl`` over the records carrying ``top_logprobs`` (:mod:`.vocab`), else None."""
    """None when every record fit one forward step; else the sizes, how many records ran as a
    chunked prefill or in one forward, and each probe of chunked prefill's exactness
    (:func:`rla.rollout.prefill.check`)."""

    def ranked_regions(self, metric: str = "mismatch/k3") -> list[tuple[str, float]]:
        return sorted(self.attribution[metric].items(), key=lambda kv: -kv[1])

    def to_dict(self) -> dict:
        d = {
            "profile": self.profile,
            "regions": list(self.regions),
            "n_sequences": self.n_sequences,
            "n_input_records": self.n_input,
            "duplicates": self.duplicates,
            "n_tokens": self.n_tokens,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "rounding_scale": self.scale.to_dict() if self.scale is not None else None,
            "settings_check": self.settings.to_dict() if self.settings is not None else None,
            "policy_check": self.policy.to_dict() if self.policy is not None else None,
            "input_notes": self.input_notes,
            "long_inputs": self.long_inputs,
            "vocab_kl": vocab_summary(self.vocab),
            "metrics": self.metrics,
            "attribution": self.attribution,
            "unexplained": self.unexplained,
            "per_position": {k: [list(p) for p in v] for k, v in self.per_position.items()},
        }
        if self.detection is not None:
            d["detection"] = self.detection.to_dict()
        return d


def _per_position(delta: np.ndarray, mask: np.ndarray, bins: int = 20) -> list[tuple[float, float]]:
    width = max(1, math.ceil(mask.shape[1] / bins))
    curve = []
    for start in range(0, mask.shape[1], width):
        m = mask[:, start : start + width]
        if m.any():
            curve.append((start + (width - 1) / 2, float(np.abs(delta[:, start : start + width][m]).mean())))
    return curve


def _check_unaligned(model):
    from rla.alignment import alignment_of

    state = alignment_of(model)
    if state is not None:
        raise ValueError(
            "diagnose needs the model as the trainer runs it without rla; it is aligned now "
            f"({state}). Call rla.unalign(model) first."
        )


def profile_groups() -> list[tuple[RoundingProfile, ...]]:
    """The built-in profiles, grouped by identical rounding points, in table order."""
    groups: list[list[RoundingProfile]] = []
    for name in profile_names():
        p = get_profile(name)
        for g in groups:
            if g[0].same_rounding(p):
                g.append(p)
                break
        else:
            groups.append([p])
    return [tuple(g) for g in groups]


def _aligned_by_group(model, records, sizes, bar, fit: list[int] | None = None):
    """group -> [B, R] logprobs with all regions aligned to it; with ``fit`` (rows), also group ->
    [len(fit), R', len(FACTORS)] at every temperature factor of the fit (:mod:`.temperature`)."""
    groups = profile_groups()
    task = bar.add(f"every profile, all regions aligned: {len(groups)} forwards", len(groups))
    out, grids = {}, {}
    for g in groups:
        names = tuple(p.name for p in g)
        label = group_label(names)
        if fit is not None and len(fit) == len(records):  # one forward gives both
            grids[names] = forward_pass(model, records, g[0], REGIONS, sizes, bar, label, factors=FACTORS)
            out[names] = np.ascontiguousarray(grids[names][..., ONE])
        else:
            out[names] = forward_pass(model, records, g[0], REGIONS, sizes, bar, label)
            if fit is not None:
                grids[names] = forward_pass(model, [records[i] for i in fit], g[0], REGIONS, sizes, bar,
                                            f"{label}, temperature fit", factors=FACTORS)
        bar.advance(task)
    return (out, grids) if fit is not None else out


def _detection(by_group: dict[tuple[str, ...], np.ndarray], mu, mask) -> Detection:
    n = mask.shape[0]
    scored = sorted(
        ((g, M.mismatch(pi, mu, mask)["mismatch/k3"], per_sequence_k3(pi, mu, mask)) for g, pi in by_group.items()),
        key=lambda s: s[1],
    )
    best = scored[0]
    ranking = [(g, k3) for g, k3, _ in scored]
    same = " Profiles joined by '=' round identically and cannot be told apart." if len(best[0]) > 1 else ""
    if len(scored) == 1:
        return Detection(ranking, best[0], n >= MIN_DETECT_SEQUENCES, float("inf"), n, f"only one candidate.{same}")
    second = scored[1]
    diff = second[2] - best[2]
    se = diff.std(ddof=1) / math.sqrt(n) if n > 1 else float("inf")
    z = float(diff.mean() / se) if se > 0 else (float("inf") if diff.mean() > 0 else 0.0)
    b, s2 = group_label(best[0]), group_label(second[0])
    if n < MIN_DETECT_SEQUENCES:
        return Detection(ranking, best[0], False, z, n, (
            f"not called: {n} distinct sequences, detection needs at least {MIN_DETECT_SEQUENCES} "
            f"({b} has the lowest k3, {best[1]:.3e}, {z:.1f} standard errors below {s2}); sample more rollouts.{same}"))
    if not z > 2:
        return Detection(ranking, best[0], False, z, n, (
            f"too close to call: {b} (k3 {best[1]:.3e}) and {s2} (k3 {second[1]:.3e}) differ by "
            f"{z:.1f} standard errors (two needed) over {n} sequences; sample more rollouts.{same}"))
    return Detection(ranking, best[0], True, z, n, (
        f"{b} explains the rollouts best (lowest k3 with all regions aligned), {z:.1f} standard errors below "
        f"{s2} over {n} sequences.{same}"))


def diagnose(
    model: torch.nn.Module,
    records,
    profile: str | RoundingProfile = "vllm",
    *,
    regions: tuple[str, ...] = REGIONS,
    detect: bool = True,
    max_tokens: int | None = None,
    memory_budget: int | None = None,
    progress: bool = False,
) -> Diagnosis:
    """Attribute the mismatch between ``model`` and the rollout ``records`` to regions, if it is rounding.

    ``model`` is the training model as the trainer runs it without rla (HF eager rounding);
    ``profile`` is the engine the records came from (``"auto"`` detects it first). The returned
    :class:`Diagnosis` carries a :class:`~rla.diagnosis.verdict.Verdict`: when it is not
    ``attributed``, the attribution is computed but must not be read as an explanation (the report
    does not); when it is ``attributed`` but not ``ok`` (``rounding_weights_unverified``: the
    records do not say which weights sampled them), it holds only if the checkpoint's did.

    ``max_tokens`` (default 16384) and ``memory_budget`` (bytes) size every training forward as
    :func:`rla.logprobs` does: a record longer than ``max_tokens`` runs as a chunked prefill where
    that is bit-identical to one forward; ``Diagnosis.long_inputs`` says what was done.

    ``regions`` may include ``"router"`` for an MoE model (``rla.align``'s router region, with the
    profile's router points): routing is then attributed as its own region beside RoPE, SwiGLU
    and the norms (2^4 training forwards instead of 2^3).
    """
    records = list(records)
    if not records:
        raise ValueError("diagnose needs at least one rollout record")
    from rla.alignment import ALIGN_REGIONS, moe_layers  # deferred, as every alignment import of this floor

    bad = [r for r in regions if r not in ALIGN_REGIONS]
    if bad or not regions:
        raise ValueError(f"regions must be a non-empty subset of {ALIGN_REGIONS}, got {regions}")
    if "router" in regions and not moe_layers(model):
        raise ValueError(f"regions include 'router', but {type(model).__name__} has no MoE block; diagnose "
                         f"without it (regions={tuple(r for r in regions if r != 'router')})")
    for name, v in (("max_tokens", max_tokens), ("memory_budget", memory_budget)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    sizes = Sizes(max_tokens, memory_budget)
    # an engine alias ("vllm") is the row of the engine version the records carry (engine_version),
    # else of the installed engine's (rla.profiles.for_engine; a warning when it has no calibrated row)
    match = None if profile == "auto" or not isinstance(profile, str) else for_engine(profile, records=records)
    prof = None if profile == "auto" else (match.profile if match is not None else resolve(profile))
    _check_unaligned(model)
    check = check_records(model, records)
    records = check.records
    if prof is not None:
        check_engine(records, prof)
    policy = check_policy(model, records, check.indices)
    mu, mask = M.pad_rows([np.asarray(r.logprobs, dtype=np.float64) for r in records])
    notes = [n for n in (check.note(), match and match.version and match.message()) if n]
    if policy.stale:  # before any forward: nothing measured on these rollouts could be read as rounding
        return Diagnosis(profile=prof.name if prof is not None else "auto",
                         regions=tuple(regions), n_sequences=len(records), n_tokens=int(mask.sum()), metrics={},
                         attribution={}, unexplained={}, per_position={},
                         verdict=Verdict("beyond_rounding", "stale_weights", policy.message, None, policy.mismatched()),
                         policy=policy, n_input=check.n_input, duplicates=check.duplicates, input_notes=notes)
    bar = Progress(progress, transient=True)
    try:
        rows = fit_rows([len(r.response_ids) for r in records])
        by_group, grids = _aligned_by_group(model, records, sizes, bar, fit=rows)
        reference = fp32_reference(model, records, sizes, bar)
        scale = rounding_scale(reference, {group_label(g): v for g, v in by_group.items()}, mask)
        width = next(iter(grids.values())).shape[1]
        temperature = fit_temperature({group_label(g): v for g, v in grids.items()}, reference[rows][:, :width],
                                      mu[rows][:, :width], mask[rows][:, :width],
                                      indices=[check.indices[i] for i in rows],
                                      temperatures=[records[i].temperature for i in rows])
        settings = check_settings(model, records, profile_groups(), reference, by_group, mu, mask, sizes, bar)
        detection = _detection(by_group, mu, mask)
        if prof is None:
            prof = get_profile(detection.best[0])  # detected: the engine field is not checked against a guess
        elif not detect:
            detection = None
        combos = subsets(tuple(regions))
        task = bar.add(f"diagnosing against {prof.name}: {len(combos)} training forwards", len(combos))
        metrics, deltas, curves, values, seq = {}, {}, {}, {}, {}
        for s in combos:
            label = subset_label(s, tuple(regions))
            same = [g for g in by_group if set(s) == set(REGIONS) and get_profile(g[0]).same_rounding(prof)]
            pi = by_group[same[0]] if same else forward_pass(model, records, prof, s, sizes, bar, label)
            delta = np.where(mask, pi - mu, 0.0)
            metrics[label] = M.mismatch(pi, mu, mask)
            deltas[label] = delta[mask]
            curves[label] = _per_position(delta, mask)
            values[frozenset(s)] = metrics[label]
            if not s or set(s) == set(regions):
                seq[frozenset(s)] = per_sequence_k3(pi, mu, mask)
            bar.advance(task)
        attribution = {m: shapley({k: v[m] for k, v in values.items()}, tuple(regions)) for m in ATTRIBUTED}
        none, full = values[frozenset()], values[frozenset(regions)]
        unexplained = {m: (full[m] / none[m] if none[m] > 0 else float("nan")) for m in ATTRIBUTED}
        vocab = vocab_kl_of_records(model, records)
        verdict = Verdict("beyond_rounding", settings.cause, settings.message,
                          settings.k3_recorded / settings.scale.k3 if settings.scale.k3 > 0 else float("inf"),
                          list(check.indices)) if settings.cause is not None else judge(model, records, check.indices, mu, mask, scale, {group_label(g): v for g, v in by_group.items()},
                        prof.name, seq[frozenset()], seq[frozenset(regions)], tuple(regions),
                        sizes=sizes, bar=bar, temperature=temperature, weights=policy.unverified())
    finally:
        bar.close()
    return Diagnosis(
        profile=prof.name,
        regions=tuple(regions),
        n_sequences=len(records),
        n_tokens=int(mask.sum()),
        metrics=metrics,
        attribution=attribution,
        unexplained=unexplained,
        per_position=curves,
        deltas=deltas,
        detection=detection,
        verdict=verdict,
        scale=scale,
        settings=settings,
        policy=policy,
        n_input=check.n_input,
        duplicates=check.duplicates,
        input_notes=notes,
        long_inputs=sizes.summary(),
        vocab=vocab,
    )


def detect_profile(model, records, *, max_tokens: int | None = None, memory_budget: int | None = None,
                   progress: bool = False) -> Detection:
    """Rank the built-in profiles by k3 with all regions aligned to each (lowest explains best).

    Profiles with the same rounding points give the same forward and are reported together. The
    call is made only over at least :data:`MIN_DETECT_SEQUENCES` distinct sequences (exact
    duplicates counted once) and when the best beats the second by more than two standard errors
    of the per-sequence k3 difference; ``Detection.z`` states that confidence either way.
    """
    records = list(records)
    if not records:
        raise ValueError("detect_profile needs at least one rollout record")
    _check_unaligned(model)
    records = check_records(model, records).records
    mu, mask = M.pad_rows([np.asarray(r.logprobs, dtype=np.float64) for r in records])
    bar = Progress(progress, transient=True)
    try:
        return _detection(_aligned_by_group(model, records, Sizes(max_tokens, memory_budget), bar), mu, mask)
    finally:
        bar.close()
