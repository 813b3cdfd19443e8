"""``rla experiment GRID --out DIR [--parallel N]``: models x arms x seeds, resumable, summarised."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("grid", help="grid YAML: base config, models, arms, seeds (see rla.rl.experiment)")
    parser.add_argument("--out", required=True, help="experiment folder (runs/, init/, summary.md, plots/)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (they share the GPU)")
    parser.add_argument("--runs-per-process", type=int, default=1, metavar="K",
                        help="put up to K runs of one GPU in one process, a thread and CUDA stream each, so that small "
                        "models' kernels overlap on the GPU (rla.rl.run_group); --parallel then counts processes")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds; then running runs checkpoint and stop, to be resumed by the next call")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds runs get to checkpoint and exit after the time limit (then killed)")
    parser.add_argument("--gpus", default=None, help="comma-separated GPU ids to spread runs over (default: all see the same)")
    parser.add_argument("--only", default=None, help="run only runs whose name (model__arm__sSEED) contains this; comma-separated parts must all "
                        "occur (qwen2-50m__,__s0: that model's seed-0 runs)")
    parser.add_argument("--summarize-only", action="store_true", help="write summary and plots from the logs; run nothing")


def run(args) -> int:
    from pathlib import Path

    from rla.console import console as make_console

    from rla.rl.experiment import load_grid, run_grid, summarize

    console = make_console()
    if args.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
    if args.runs_per_process < 1:
        raise ValueError(f"--runs-per-process must be >= 1, got {args.runs_per_process}")
    grid = load_grid(args.grid)
    say = lambda msg: console.print(msg, highlight=False)  # noqa: E731
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
    if args.summarize_only:
        summary = summarize(args.out, grid)
    else:
        summary = run_grid(grid, args.out, parallel=args.parallel, time_limit_s=args.time_limit, gpus=gpus,
                           only=args.only, say=say, grace_s=args.grace, runs_per_process=args.runs_per_process)
    done = sum(r["finished"] for r in summary["runs"])
    say(f"{done}/{len(summary['runs'])} runs finished; summary: {Path(args.out) / 'summary.md'}")
    return 0
