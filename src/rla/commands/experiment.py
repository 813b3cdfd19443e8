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
    parser.add_argument("--collapse", default="reward", choices=("reward", "signal", "either"),
                        help="collapse criterion of the dose report (grids with train_dose_bits arms; rla.rl.dose_report): "
                        "reward = final reward < 0.5 x the starting reward; signal = docs/metrics.md's signal fired")
    parser.add_argument("--probe", action="store_true",
                        help="measure every arm's step-0 mismatch (one rollout batch per model and seed, no training) "
                        "into OUT/probe.md and OUT/probe.json; run nothing else (rla.rl.probe)")
    parser.add_argument("--probe-seeds", default=None, help="with --probe: comma-separated seeds instead of the grid's")
    parser.add_argument("--pick-doses", default=None, metavar="K3,K3,...",
                        help="with --probe: for each step-0 k3 target pick the dose arm whose probed k3 is nearest (log "
                        "scale, each arm once) and write OUT/picked_grid.yaml: the grid with its non-dose arms and "
                        "the picked doses, for one model (rla.rl.probe.pick_doses)")


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
    if args.probe:
        from rla.rl.experiment import make_warm_starts
        from rla.rl.grid import matches_only
        from rla.rl.probe import check_pick, pick_doses, probe_step0

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
        # the probe needs each model's initial weights: make missing warm starts, as a run would
        out.mkdir(parents=True, exist_ok=True)
        make_warm_starts([s for s in grid.runs(out) if matches_only(s.name, args.only)], out,
                         parallel=args.parallel, gpus=gpus, say=say, grace_s=args.grace)
        result = probe_step0(grid, out, only=args.only, seeds=seeds, say=say)
        say(f"step-0 mismatch per arm: {out / 'probe.md'}")
        if targets is not None:
            import yaml

            arms, rows = pick_doses(result, grid, targets)
            model = next(r["model"] for r in result["runs"])
            picked.write_text(yaml.safe_dump({"base": grid.base, "models": {model: grid.models[model]}, "arms": arms,
                                              "seeds": grid.seeds}, sort_keys=False))
            for r in rows:
                say(f"target k3 {r['target']:.1e}: {r['arm']} (probed {r['k3_geomean']:.2e}, "
                    f"{r['decades_off']:+.2f} decades)")
            say(f"picked grid: {picked}")
        return 0
    if args.summarize_only:
        summary = summarize(args.out, grid, dose_criterion=args.collapse)
    else:
        summary = run_grid(grid, args.out, parallel=args.parallel, time_limit_s=args.time_limit, gpus=gpus,
                           only=args.only, say=say, grace_s=args.grace, dose_criterion=args.collapse,
                           runs_per_process=args.runs_per_process)
    done = sum(r["finished"] for r in summary["runs"])
    say(f"{done}/{len(summary['runs'])} runs finished; summary: {Path(args.out) / 'summary.md'}")
    if (Path(args.out) / "dose_report.md").is_file():
        say(f"dose-response report: {Path(args.out) / 'dose_report.md'}")
    return 0
