"""``rla train CONFIG [key=value ...] [--resume]``: one GRPO / REINFORCE run (rla.rl.trainer)."""

from __future__ import annotations

from rla.commands._args import positive_int


def add_arguments(parser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config file (fields: rla train --help-config)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train_precision=aligned seed=3")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in out_dir from its last checkpoint (starts fresh if it has none)")
    parser.add_argument("--help-config", action="store_true", help="list every config field with its default and help")
    parser.add_argument("--take-over", action="store_true",
                        help="take over out_dir's lock when it names a process on another host that you know is gone")
    parser.add_argument("--until-step", type=positive_int, default=None, help="stop (checkpointed) after this step (>= 1)")


def run(args) -> int:
    from rla.rl.config import config_help, load_config

    if args.help_config:
        print(config_help())
        return 0
    config, overrides = args.config, list(args.overrides)
    if config is None:
        raise ValueError("rla train needs a config file, e.g. `rla train configs/grpo_tiny.yaml` (fields: rla train "
                         "--help-config); it does not start a default run on its own")
    if "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config, *overrides]  # only overrides, no file
        if not any(o.split("=", 1)[0].strip() == "out_dir" for o in overrides):
            raise ValueError("rla train with overrides only (no config file) needs out_dir=FOLDER among them, so a run "
                             "never lands in a default folder by accident")
    cfg = load_config(config, overrides)
    if args.until_step is not None and args.until_step > cfg.steps:
        raise ValueError(f"--until-step {args.until_step} is past the run's last step ({cfg.steps} steps)")
    from rla.rl.trainer import train

    result = train(cfg, resume=args.resume, until_step=args.until_step, take_over=args.take_over)
    summary = result.get("summary")
    if summary is not None:
        from rla.console import console as make_console

        console = make_console()
        state = "finished" if result["finished"] else f"stopped at step {result['step']} (resume with --resume)"
        s0 = summary.get("step0", {})
        console.print(
            f"[bold]{cfg.out_dir}[/]: {state}; step-0 k3 {_f(s0.get('k3'))}, mean |delta| {_f(s0.get('abs_mean'))}; "
            f"final reward {_f(summary.get('final_reward'), '.3f')}, best {_f(summary.get('best_reward'), '.3f')}",
            highlight=False)
        events = summary.get("collapse_events") or []
        if events:
            console.print(f"[bold red]collapse signal fired at step(s) {[e['step'] for e in events]}[/]", highlight=False)
        else:
            console.print("collapse signal: never fired", highlight=False)
    return 0


def _f(x, spec: str = ".2e") -> str:
    return "-" if x is None else format(x, spec)
