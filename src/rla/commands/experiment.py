"""``rla experiment GRID --out DIR [--parallel N]``: models x arms x seeds, resumable, summarised."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("grid", help="grid YAML: base config, models, arms, seeds (see rla.rl.experiment)")
    parser.add_argument("--out", required=True, help="experiment folder (runs/, init/, summary.md, plots/)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (they share the GPU)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds; then running runs checkpoint and stop, to be resumed by the next call")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds runs get to checkpoint and exit after the time limit (then killed)")
    parser.add_argument("--gpus", default=None, help="comma-separated GPU ids to spread runs over (default: all see the same)")
    parser.add_argument("--only", default=None, help="run only runs whose name (model__arm__sSEED) contains this; comma-separated parts must all "
                        "occur (qwen2-50m__,__s0: that model's seed-0 runs)")
    parser.add_argument("--summarize-only", action="store_true", help="write summary and plots from the logs; run nothing")
    parser.add_argument("--collapse", default="reward", choices=("reward", "signal", "either"),
                        help="collapse criterion of the dose report (grids with train_dose_bits arms; rla.rl.dose_report): "
                        "reward = final reward < 0.5 x the starting reward; signal = docs/metrics.md's signal fired")
    parser.add_argument("--probe", action="store_true",
                        help="measure every arm's step-0 mismatch (one rollout batch per model and seed, no training) "
                        "into OUT/probe.md and OUT/probe.json; run nothing else (rla.rl.probe)")
    parser.add_argument("--probe-seeds", default=None, help="with --probe: comma-separated seeds instead of the grid's")


def run(args) -> int:
    from pathlib import Path

    from rich.console import Console

    from rla.rl.experiment import load_grid, run_grid, summarize

    console = Console()
    if args.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
    grid = load_grid(args.grid)
    say = lambda msg: console.print(msg, highlight=False)  # noqa: E731
    if args.probe:
        from rla.rl.probe import probe_step0

        seeds = [int(x) for x in args.probe_seeds.split(",")] if args.probe_seeds else None
        probe_step0(grid, args.out, only=args.only, seeds=seeds, say=say)
        say(f"step-0 mismatch per arm: {Path(args.out) / 'probe.md'}")
        return 0
    if args.summarize_only:
        summary = summarize(args.out, grid, dose_criterion=args.collapse)
    else:
        gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
        summary = run_grid(grid, args.out, parallel=args.parallel, time_limit_s=args.time_limit, gpus=gpus,
                           only=args.only, say=say, grace_s=args.grace, dose_criterion=args.collapse)
    done = sum(r["finished"] for r in summary["runs"])
    say(f"{done}/{len(summary['runs'])} runs finished; summary: {Path(args.out) / 'summary.md'}")
    if (Path(args.out) / "dose_report.md").is_file():
        say(f"dose-response report: {Path(args.out) / 'dose_report.md'}")
    return 0
