"""Diagnosis: which region explains how much of the train/rollout mismatch.

For every subset of the regions (eight training forwards for three regions) the training model
is aligned to the profile in that subset only, its logprobs of the recorded tokens are computed
(:func:`rla.logprobs`, batched and memory bounded) and compared with the rollout logprobs. The
METRICS.md metrics of each subset give the attribution (:mod:`.attribution`), the share that full
alignment leaves unexplained, per-position curves and by-probability strata. Detection repeats
the fully aligned pass for every known profile and ranks them by k3.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch

import rla.metrics as M
from rla.diagnosis.attribution import shapley, subsets
from rla.train_logprobs import logprobs as train_logprobs
from rla.profiles import REGIONS, RoundingProfile, names as profile_names, get as get_profile, resolve

__all__ = ["Diagnosis", "diagnose", "detect_profile", "subset_label"]

ATTRIBUTED = ("mismatch/k3", "mismatch/abs/mean")


def subset_label(s) -> str:
    s = tuple(s)
    if not s:
        return "none"
    if len(s) == len(REGIONS) and set(s) == set(REGIONS):
        return "all"
    return "+".join(s)


@dataclass
class Detection:
    ranking: list[tuple[str, float]]
    """(profile or group of profiles with identical rounding, k3 with all regions aligned), best first."""
    best: str
    too_close: bool
    note: str


@dataclass
class Diagnosis:
    profile: str
    regions: tuple[str, ...]
    n_sequences: int
    n_tokens: int
    metrics: dict[str, dict[str, float]]
    """subset label -> METRICS.md metrics of the training forward with that subset aligned."""
    attribution: dict[str, dict[str, float]]
    """metric -> region -> Shapley value (mismatch removed by aligning that region)."""
    unexplained: dict[str, float]
    """metric -> m(all) / m(none): the share of the mismatch left with every region aligned."""
    per_position: dict[str, list[tuple[float, float]]]
    """subset label -> [(bin centre position, mean |delta|)]."""
    deltas: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    """subset label -> flat delta = log pi - log mu of every response token (for plots)."""
    detection: Detection | None = None

    def ranked_regions(self, metric: str = "mismatch/k3") -> list[tuple[str, float]]:
        return sorted(self.attribution[metric].items(), key=lambda kv: -kv[1])

    def to_dict(self) -> dict:
        d = {
            "profile": self.profile,
            "regions": list(self.regions),
            "n_sequences": self.n_sequences,
            "n_tokens": self.n_tokens,
            "metrics": self.metrics,
            "attribution": self.attribution,
            "unexplained": self.unexplained,
            "per_position": {k: [list(p) for p in v] for k, v in self.per_position.items()},
        }
        if self.detection is not None:
            d["detection"] = {
                "ranking": [list(r) for r in self.detection.ranking],
                "best": self.detection.best,
                "too_close": self.detection.too_close,
                "note": self.detection.note,
            }
        return d


def _per_position(delta: np.ndarray, mask: np.ndarray, bins: int = 20) -> list[tuple[float, float]]:
    width = max(1, math.ceil(mask.shape[1] / bins))
    curve = []
    for start in range(0, mask.shape[1], width):
        m = mask[:, start : start + width]
        if m.any():
            curve.append((start + (width - 1) / 2, float(np.abs(delta[:, start : start + width][m]).mean())))
    return curve


@contextlib.contextmanager
def _aligned(model, profile, regions):
    import rla

    if not regions:
        yield
        return
    with rla.aligned(model, profile=profile, regions=tuple(regions)):
        yield


def _check_unaligned(model):
    import rla

    state = rla.alignment_of(model)
    if state is not None:
        raise ValueError(
            "diagnose needs the model as the trainer runs it without rla; it is aligned now "
            f"({state}). Call rla.unalign(model) first."
        )


def _pass(model, records, profile, regions, max_tokens):
    with _aligned(model, profile, regions):
        return [t.double().numpy() for t in train_logprobs(model, records, max_tokens=max_tokens)]


def diagnose(
    model: torch.nn.Module,
    records,
    profile: str | RoundingProfile = "vllm",
    *,
    regions: tuple[str, ...] = REGIONS,
    detect: bool = True,
    max_tokens: int = 16384,
    progress: bool = False,
) -> Diagnosis:
    """Attribute the mismatch between ``model`` and the rollout ``records`` to regions.

    ``model`` is the training model as the trainer runs it without rla (HF eager rounding);
    ``profile`` is the engine the records came from (``"auto"`` detects it first).
    """
    records = list(records)
    if not records:
        raise ValueError("diagnose needs at least one rollout record")
    bad = [r for r in regions if r not in REGIONS]
    if bad or not regions:
        raise ValueError(f"regions must be a non-empty subset of {REGIONS}, got {regions}")
    _check_unaligned(model)
    rollout = [np.asarray(r.logprobs, dtype=np.float64) for r in records]
    mu, mask = M.pad_rows(rollout)
    detection = None
    bar = _Progress(progress)
    if profile == "auto":
        detection = detect_profile(model, records, max_tokens=max_tokens, bar=bar)
        profile = detection.best.split(" = ")[0]
        detect = False
    prof = resolve(profile)
    combos = subsets(tuple(regions))
    task = bar.add(f"diagnosing against {prof.name}: {len(combos)} training forwards", len(combos))
    metrics, deltas, curves, values = {}, {}, {}, {}
    for s in combos:
        pi, _ = M.pad_rows(_pass(model, records, prof, s, max_tokens))
        delta = np.where(mask, pi - mu, 0.0)
        label = subset_label(s)
        metrics[label] = M.mismatch(pi, mu, mask)
        deltas[label] = delta[mask]
        curves[label] = _per_position(delta, mask)
        values[frozenset(s)] = metrics[label]
        bar.advance(task)
    attribution = {m: shapley({k: v[m] for k, v in values.items()}, tuple(regions)) for m in ATTRIBUTED}
    none, full = values[frozenset()], values[frozenset(regions)]
    unexplained = {m: (full[m] / none[m] if none[m] > 0 else float("nan")) for m in ATTRIBUTED}
    if detect:
        detection = detect_profile(model, records, max_tokens=max_tokens, bar=bar)
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
    )


def detect_profile(model, records, *, max_tokens=16384, bar=None) -> Detection:
    """Rank the built-in profiles by k3 with all regions aligned to each (lowest explains best).

    Profiles with the same rounding points give the same forward and are reported together; two
    profiles are too close to call when their per-sequence k3 difference is within two standard
    errors of zero.
    """
    records = list(records)
    mu, mask = M.pad_rows([np.asarray(r.logprobs, dtype=np.float64) for r in records])
    groups: list[list[RoundingProfile]] = []
    for name in profile_names():
        p = get_profile(name)
        for g in groups:
            if g[0].same_rounding(p):
                g.append(p)
                break
        else:
            groups.append([p])
    bar = bar or _Progress(False)
    task = bar.add(f"detecting the rollout profile: {len(groups)} candidates", len(groups))
    scored = []
    for g in groups:
        pi, _ = M.pad_rows(_pass(model, records, g[0], REGIONS, max_tokens))
        d = np.where(mask, pi - mu, 0.0)
        per_seq = np.array([M.k3_terms(d[i][mask[i]]).mean() for i in range(len(records))])
        k3 = M.mismatch(pi, mu, mask)["mismatch/k3"]
        scored.append((" = ".join(p.name for p in g), k3, per_seq))
        bar.advance(task)
    scored.sort(key=lambda s: s[1])
    best, second = scored[0], scored[1] if len(scored) > 1 else None
    too_close, note = False, f"{best[0]} explains the rollouts best (lowest k3 with all regions aligned)."
    if second is not None:
        diff = second[2] - best[2]
        se = diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else float("inf")
        if not diff.mean() > 2 * se:
            too_close = True
            note = (
                f"too close to call: {best[0]} (k3 {best[1]:.3e}) and {second[0]} (k3 {second[1]:.3e}) "
                f"differ by less than two standard errors over {len(diff)} sequences; sample more rollouts."
            )
    if " = " in best[0]:
        note += " Profiles joined by '=' round identically and cannot be told apart."
    return Detection([(s[0], s[1]) for s in scored], best[0], too_close, note)


class _Progress:
    """A rich progress bar when asked for, silent otherwise."""

    def __init__(self, enabled: bool):
        self._p = None
        if enabled:
            from rich.progress import Progress

            self._p = Progress(transient=True)
            self._p.start()

    def add(self, description, total):
        return self._p.add_task(description, total=total) if self._p else None

    def advance(self, task):
        if self._p:
            self._p.advance(task)

    def close(self):
        if self._p:
            self._p.stop()
