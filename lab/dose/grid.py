"""The dose study's grid: an ``rla experiment`` grid whose arms may also set the dose.

A dose arm sets ``train_dose_bits: B`` (1-7 explicit mantissa bits; 7 = bf16 = the aligned arm)
and optionally ``train_dose_scale: S`` (the rounding error times S, S > 0) on top of
``train_precision: aligned``. Those two keys are this study's, not ``TrainConfig``'s: the knob
enters the trainer through its ``ops=`` plug (``lab.dose.knob.DoseOps``), so :class:`DoseGrid`
keeps them beside the arms and builds each run's ``TrainConfig`` without them. ``arms`` holds the
arms as written (dose keys included, what the report and the probe read); ``runs`` and
``rla_grid`` see them without.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rla.rl.config import read_yaml_mapping
from rla.rl.grid import Grid, RunSpec, grid_from_mapping

from lab.dose.knob import DoseOps

__all__ = ["DOSE_KEYS", "DoseGrid", "load_dose_grid", "dose_of"]

DOSE_KEYS = ("train_dose_bits", "train_dose_scale")


def dose_of(over: dict) -> tuple[int, float] | None:
    """``(bits, scale)`` of an arm's overrides, or None for an arm without a dose."""
    bits = over.get("train_dose_bits")
    scale = over.get("train_dose_scale", 1.0)
    if bits is None:
        return None
    return bits, scale


def _check(name: str, merged: dict, where) -> None:
    bits, scale = merged.get("train_dose_bits"), merged.get("train_dose_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"{where}: arm {name}: train_dose_scale={scale!r} must be a finite number > 0")
    if bits is None:
        if scale != 1.0:
            raise ValueError(f"{where}: arm {name}: train_dose_scale={scale} other than 1 needs train_dose_bits")
        return
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 7:
        raise ValueError(f"{where}: arm {name}: train_dose_bits={bits!r} must be an int in [1, 7] (7 = bf16, the "
                         "aligned arm itself)")
    if merged.get("train_precision") != "aligned":
        raise ValueError(f"{where}: arm {name}: train_dose_bits={bits} needs train_precision=aligned (it rounds the "
                         f"aligned regions' outputs further), got {merged.get('train_precision', 'bf16')}")


@dataclass
class DoseGrid(Grid):
    """A ``Grid`` whose ``arms`` may carry ``DOSE_KEYS``; validated on construction."""

    def __post_init__(self):
        for name, over in self.arms.items():
            for model, model_over in self.models.items():
                _check(name, {**self.base, **model_over, **over}, self.source or "grid")

    def rla_grid(self) -> Grid:
        """The same grid without the dose keys: what ``rla.rl.experiment.run_grid`` runs."""
        arms = {a: {k: v for k, v in over.items() if k not in DOSE_KEYS} for a, over in self.arms.items()}
        return Grid(models=self.models, arms=arms, seeds=self.seeds, base=self.base, source=self.source)

    def runs(self, out: Path) -> list[RunSpec]:
        return self.rla_grid().runs(out)

    def ops_for(self, arm: str) -> DoseOps | None:
        """The arm's ``ops=`` plug: ``DoseOps(bits, scale)`` for a dose arm, None otherwise."""
        d = dose_of(self.arms[arm])
        return DoseOps(*d) if d else None


def load_dose_grid(path: str | Path) -> DoseGrid:
    """A grid file read with the dose keys taken off the arms before ``rla``'s validation."""
    path = Path(path)
    raw = read_yaml_mapping(path, "grid file", "a grid is a mapping with base, arms and seeds")
    arms = raw.get("arms")
    doses = {}
    if isinstance(arms, dict):
        stripped = {}
        for name, over in arms.items():
            if isinstance(over, dict):
                doses[name] = {k: over[k] for k in DOSE_KEYS if k in over}
                over = {k: v for k, v in over.items() if k not in DOSE_KEYS}
            stripped[name] = over
        raw = {**raw, "arms": stripped}
    grid = grid_from_mapping(raw, path)
    full = {a: {**over, **doses.get(a, {})} for a, over in grid.arms.items()}
    return DoseGrid(models=grid.models, arms=full, seeds=grid.seeds, base=grid.base, source=grid.source)
