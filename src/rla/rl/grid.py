"""The experiment grid format: models x arms x seeds over one base ``TrainConfig``.

A grid file::

    base: grpo_tiny.yaml            # a TrainConfig YAML (relative to this file) or a mapping
    overrides: {steps: 200}         # optional, applied to base
    models:                         # optional axis (default: one model, "model")
      qwen2-tiny: {arch: qwen2, size: tiny}
      llama-tiny: {arch: llama, size: tiny}
    arms:
      bf16:    {train_precision: bf16}
      aligned: {train_precision: aligned}
      rope:    {train_precision: aligned, align_regions: [rope]}
      fp16:    {train_precision: fp16}
    seeds: [0, 1, 2]

Each (model, arm, seed) is one ``RunSpec`` whose folder is ``DIR/runs/<model>__<arm>__s<seed>``;
with ``init: sft`` every arm and seed of a model starts from ``DIR/init/<model>``. Everything is
validated when the grid is read, before any run starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rla.rl.config import TrainConfig, _check_keys, read_yaml_mapping, without_retired

__all__ = ["Grid", "RunSpec", "load_grid", "grid_from_mapping", "is_finished", "matches_only"]


@dataclass
class RunSpec:
    model: str
    arm: str
    seed: int
    config: TrainConfig

    @property
    def name(self) -> str:
        return f"{self.model}__{self.arm}__s{self.seed}"


@dataclass
class Grid:
    models: dict[str, dict]
    arms: dict[str, dict]
    seeds: list[int]
    base: dict[str, Any]
    source: Path | None = None

    def runs(self, out: Path) -> list[RunSpec]:
        specs = []
        for model, model_over in self.models.items():
            for arm, arm_over in self.arms.items():
                for seed in self.seeds:
                    values = {**self.base, **model_over, **arm_over, "seed": seed,
                              "out_dir": str(out / "runs" / f"{model}__{arm}__s{seed}"), "progress": False}
                    if values.get("init", "sft") == "sft":
                        values["init"] = str(out / "init" / model)
                    specs.append(RunSpec(model, arm, seed, _config(values, f"{model}/{arm}/seed {seed}")))
        return specs


def _config(values: dict, where: str) -> TrainConfig:
    init = values.get("init")
    # the warm-start folder does not exist before it is made: validate with init=sft meanwhile
    check = dict(values, init="sft") if init and not Path(init).exists() and init not in ("sft", "bundled", "random") else values
    try:
        cfg = TrainConfig(**check)
    except (TypeError, ValueError) as e:
        raise ValueError(f"grid run {where}: {e}") from None
    cfg.init = values.get("init", cfg.init)
    return cfg


def load_grid(path: str | Path) -> Grid:
    """The grid of a grid file (``grid_from_mapping`` of its YAML)."""
    path = Path(path)
    return grid_from_mapping(read_yaml_mapping(path, "grid file", "a grid is a mapping with base, arms and seeds"), path)


def grid_from_mapping(raw: dict[str, Any], path: Path) -> Grid:
    """A validated ``Grid`` from a grid file's mapping (``path``: where it came from, for a relative
    ``base`` and for errors). A study whose arms carry keys of its own strips them first (the dose
    study: ``lab.dose.grid``)."""
    unknown = set(raw) - {"base", "overrides", "models", "arms", "seeds"}
    if unknown:
        raise ValueError(f"{path}: unknown grid key(s) {sorted(unknown)}; known: base, overrides, models, arms, seeds")
    base = raw.get("base", {})
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        base = read_yaml_mapping(base_path, f"{path}: base config", "a config file is a mapping of field: value")
    if not isinstance(base, dict):
        raise ValueError(f"{path}: base must be a config file name or a mapping")
    base = without_retired({**base, **(raw.get("overrides") or {})}, f"{path}: base")
    models = raw.get("models") or {"model": {}}
    arms = raw.get("arms")
    if not arms or not isinstance(arms, dict):
        raise ValueError(f"{path}: arms must be a non-empty mapping of arm name -> config overrides")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = list(range(seeds))
    if not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{path}: seeds must be a list of ints (or a count), got {seeds!r}")
    for name, over in [*models.items(), *arms.items()]:
        if not isinstance(over, dict):
            raise ValueError(f"{path}: {name} must map to config overrides, got {type(over).__name__}")
        if "__" in str(name) or "/" in str(name):
            raise ValueError(f"{path}: name {name!r} may not contain '__' or '/' (it names a folder)")
    models = {name: without_retired(over, f"{path}: {name}") for name, over in models.items()}
    arms = {name: without_retired(over, f"{path}: {name}") for name, over in arms.items()}
    for name, over in [*models.items(), *arms.items()]:
        _check_keys(over, f"{path}: {name}")
    _check_keys(base, f"{path}: base")
    return Grid(models=dict(models), arms=dict(arms), seeds=list(seeds), base=base, source=path)


def is_finished(run_dir: Path, steps: int) -> bool:
    """True when the run's summary says it reached ``steps`` (a grid may raise steps later)."""
    try:
        return int(json.loads((run_dir / "summary.json").read_text()).get("step", 0)) >= steps
    except (OSError, ValueError):
        return False


def matches_only(name: str, only: str | None) -> bool:
    """``--only``: True when ``only`` is empty or ``name`` contains every comma-separated part of it
    (``qwen2-50m__,__s0``: model qwen2-50m, seed 0)."""
    return not only or all(part in name for part in only.split(",") if part)
