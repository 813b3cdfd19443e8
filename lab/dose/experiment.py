"""``python -m lab.dose.experiment GRID --out DIR [...]``: a dose-response grid, run and reported.

``rla experiment``'s options and behaviour (``rla.rl.experiment``: models x arms x seeds as
resumable processes, ``--time-limit``, ``--runs-per-process``, warm starts, ``--summarize-only``),
for a grid whose arms may set the dose (``lab.dose.grid``). What the study adds:

- each run's dose goes to the trainer through its ``ops=`` plug: ``DIR/runs/<run>/dose.json``,
  read by ``lab.dose.run``, the jobs' entry point;
- the dose-response report (``lab.dose.report``): ``DIR/dose_report.{md,json}`` and
  ``DIR/plots/dose_response.png``, collapse judged by ``--collapse``;
- ``--probe`` (``lab.dose.probe``): every arm's step-0 mismatch, no training, and with
  ``--pick-doses K3,...`` the grid of the doses nearest those targets (``DIR/picked_grid.yaml``).

Run from the repository root (the lab is not installed): ``PYTHONPATH=src:. python -m
lab.dose.experiment lab/dose/configs/experiment_dose_h200_small.yaml --out /tmp/dose``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lab.dose.grid import DoseGrid, dose_of, load_dose_grid
from lab.dose.report import CRITERIA, dose_report, is_dose_grid
from lab.dose.run import write_dose

__all__ = ["summarize", "run", "main"]

_LAB_ROOT = str(Path(__file__).resolve().parents[2])


def summarize(out: str | Path, grid: DoseGrid, criterion: str = "reward", plots: bool = True) -> dict:
    """``rla``'s grid summary of ``out`` and, for a grid with dose arms, the dose-response report
    (in the summary under ``dose_report``); ``plots=False``: no figures drawn (the numbers are the same)."""
    from rla.rl.experiment import summarize as summarize_grid

    summary = summarize_grid(out, grid.rla_grid(), plots=plots)
    if is_dose_grid(grid):
        summary["dose_report"] = dose_report(out, grid, summary, criterion=criterion, plots=plots)
    return summary


def _parser() -> argparse.ArgumentParser:
    from rla.commands.experiment import add_arguments

    p = argparse.ArgumentParser(prog="python -m lab.dose.experiment", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--collapse", default="reward", choices=CRITERIA,
                   help="collapse criterion of the dose report: reward = final reward < 0.5 x the starting reward; "
                   "signal = docs/metrics.md's signal fired; either")
    p.add_argument("--probe", action="store_true",
                   help="measure every arm's step-0 mismatch (one rollout batch per model and seed, no training) "
                   "into OUT/probe.md and OUT/probe.json; run nothing else (lab.dose.probe)")
    p.add_argument("--probe-seeds", default=None, help="with --probe: comma-separated seeds instead of the grid's")
    p.add_argument("--pick-doses", default=None, metavar="K3,K3,...",
                   help="with --probe: for each step-0 k3 target pick the dose arm whose probed k3 is nearest (log "
                   "scale, each arm once) and write OUT/picked_grid.yaml: the grid with its non-dose arms and the "
                   "picked doses, for one model (lab.dose.probe.pick_doses)")
    return p


def _probe(args, grid: DoseGrid, gpus, say) -> int:
    import yaml

    from rla.rl.experiment import make_warm_starts
    from rla.rl.grid import matches_only

    from lab.dose.probe import check_pick, pick_doses, probe_step0

    out = Path(args.out)
    targets, picked = None, out / "picked_grid.yaml"
    if args.pick_doses:
        try:
            targets = [float(x) for x in args.pick_doses.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--pick-doses takes comma-separated numbers, got {args.pick_doses!r}") from None
        check_pick(grid, targets, args.only)
        if picked.exists():
            raise ValueError(f"{picked} exists (an earlier pick); move it away first, it is not overwritten")
    seeds = [int(x) for x in args.probe_seeds.split(",")] if args.probe_seeds else None
    out.mkdir(parents=True, exist_ok=True)
    # the probe needs each model's initial weights: make missing warm starts, as a run would
    make_warm_starts([s for s in grid.runs(out) if matches_only(s.name, args.only)], out,
                     parallel=args.parallel, gpus=gpus, say=say, grace_s=args.grace)
    result = probe_step0(grid, out, only=args.only, seeds=seeds, say=say)
    say(f"step-0 mismatch per arm: {out / 'probe.md'}")
    if targets is not None:
        arms, rows = pick_doses(result, grid, targets)
        model = next(r["model"] for r in result["runs"])
        picked.write_text(yaml.safe_dump({"base": grid.base, "models": {model: grid.models[model]}, "arms": arms,
                                          "seeds": grid.seeds}, sort_keys=False))
        for r in rows:
            say(f"target k3 {r['target']:.1e}: {r['arm']} (probed {r['k3_geomean']:.2e}, "
                f"{r['decades_off']:+.2f} decades)")
        say(f"picked grid: {picked}")
    return 0


def run(args) -> int:
    from rich.console import Console

    from rla.rl.experiment import run_grid

    console = Console()
    say = lambda msg: console.print(msg, highlight=False)  # noqa: E731
    if args.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
    if args.runs_per_process < 1:
        raise ValueError(f"--runs-per-process must be >= 1, got {args.runs_per_process}")
    grid = load_dose_grid(args.grid)
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
    if args.probe:
        return _probe(args, grid, gpus, say)
    out = Path(args.out)
    if args.summarize_only:
        summary = summarize(out, grid, args.collapse)
    else:
        for spec in grid.runs(out):
            write_dose(Path(spec.config.out_dir), dose_of(grid.arms[spec.arm]))
        # the jobs import lab.dose.run: the lab's root on their path (rla's scheduler adds src/)
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if _LAB_ROOT not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([_LAB_ROOT, *filter(None, paths)])
        run_grid(grid.rla_grid(), out, parallel=args.parallel, time_limit_s=args.time_limit, gpus=gpus,
                 only=args.only, say=say, grace_s=args.grace, runs_per_process=args.runs_per_process,
                 plug="lab.dose.run")
        summary = summarize(out, grid, args.collapse)
    done = sum(r["finished"] for r in summary["runs"])
    say(f"{done}/{len(summary['runs'])} runs finished; summary: {out / 'summary.md'}")
    if "dose_report" in summary:
        say(f"dose-response report: {out / 'dose_report.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
