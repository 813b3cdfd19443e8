"""``python -m lab.dose.run RUN.yaml [RUN.yaml ...]``: the dose study's runs, with the dose plugged in.

``lab.dose.experiment`` hands this module to ``rla.rl.experiment.run_grid`` as its ``plug``: each
job runs its runs as ``rla train RUN.yaml --resume`` would (one run) or as ``rla.rl.run_group``
does (several, a thread each), with ``Trainer(cfg, ops=...)`` built from the run folder's
``dose.json`` (``{"bits": B, "scale": S}``, written by ``lab.dose.experiment`` before the grid
runs; no file: no dose, rla's own ops).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lab.dose.knob import DoseOps

__all__ = ["DOSE_FILE", "ops_for", "write_dose", "main"]

DOSE_FILE = "dose.json"


def write_dose(run_dir: Path, dose: tuple[int, float] | None) -> None:
    """Record a run's dose in its folder; a run that already has one keeps it unless it is the same
    (a resumed run never changes its dose; an arm without a dose has no file)."""
    path = Path(run_dir) / DOSE_FILE
    want = None if dose is None else {"bits": dose[0], "scale": float(dose[1])}
    have = json.loads(path.read_text()) if path.is_file() else None
    if have is not None and have != want:
        raise ValueError(f"{run_dir}: its recorded dose {have} differs from the grid's {want}; a run keeps its dose "
                         "(use another --out)")
    if want is not None and have is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want))


def ops_for(run_yaml: str | Path) -> DoseOps | None:
    """The ``ops=`` plug of the run whose config is ``run_yaml``: its folder's dose, or None."""
    path = Path(run_yaml).parent / DOSE_FILE
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    return DoseOps(d["bits"], d["scale"])


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lab.dose.run RUN.yaml [RUN.yaml ...]", file=sys.stderr)
        return 2
    if len(argv) == 1:
        from rla.rl.config import load_config
        from rla.rl.trainer import train

        train(load_config(argv[0]), resume=True, ops=ops_for(argv[0]))
        return 0
    from rla.rl.run_group import run_group

    status = run_group(argv, ops_for=ops_for)
    return 1 if any(s == "failed" for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
