"""The ``rla`` command line. It parses arguments and calls the library; nothing else.

Each subcommand lives in ``rla.commands.<name>`` with ``add_arguments(parser)`` and
``run(args) -> int`` and is imported only when it runs, so ``rla --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("rla.commands.demo", "sample from the bundled tiny model under vllm and diagnose the mismatch (the main job)"),
    "diagnose": ("rla.commands.diagnose", "attribute a model's train/rollout mismatch to regions, detect the engine profile"),
    "triage": ("rla.commands.triage", "numerics or plumbing: read a framework's dump, check shift, settings, batch variance, positions before rounding"),
    "doctor": ("rla.commands.doctor", "static precision hazards of a model, each with its fix"),
    "bench": ("rla.commands.bench", "benchmark the fused ops and an aligned training step (CUDA)"),
    "profiles": ("rla.commands.profiles", "print the rounding-profile table"),
    "calibrate": ("rla.commands.calibrate", "measure where an engine rounds, from its own code, into a profile file"),
    "verify": ("rla.commands.verify", "the aligned model against a twin built from the engine's own code, layer by layer"),
    "check-ops": ("rla.commands.check_ops", "run every region under every profile, show where outputs part"),
    "train": ("rla.commands.train", "GRPO / REINFORCE with an engine-profile rollout stack (rla.rl)"),
    "experiment": ("rla.commands.experiment", "models x arms x seeds of rla train, resumable, with summary and plots"),
}



class _PrintVersion(argparse.Action):
    """``--version``: one line, unwrapped (argparse's own version action refills it to the terminal)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from rla.version import versions_line

        print(versions_line())
        parser.exit()


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rla",
        description="Rounding-location alignment for LLM RL: make the training forward round "
        "where the inference engine rounds.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action=_PrintVersion, help="print the versions of rla, torch and transformers and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except Exception as e:
        # the user's errors (rla.errors.is_user_error: rla's own refusals, a missing file) are one
        # line and exit 2; anything else is a bug and keeps its traceback
        from rla.errors import is_user_error

        if args.debug or os.environ.get("RLA_DEBUG"):
            raise
        from rich.console import Console

        console = Console(stderr=True)
        if not is_user_error(e):
            console.print(f"[bold red]rla {args.command}: internal error ({type(e).__name__}):[/] a bug in rla or in a "
                          "library it calls; please report it with the traceback below", highlight=False, soft_wrap=True)
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        console.print(f"[bold red]rla {args.command}: error:[/] {msg}", highlight=False, soft_wrap=True)
        return 2

if __name__ == "__main__":
    sys.exit(main())
