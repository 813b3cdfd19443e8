"""``rla calibrate``: measure where an engine rounds, from its own code, into a profile file; with
``--live``, from the running engine's logprobs (``rla.commands.calibrate_live``)."""

from __future__ import annotations

from rla.commands._args import MODEL_HELP, model_path
from rla.commands._live import add_live_arguments


def add_arguments(parser) -> None:
    parser.add_argument("--engine", default="vllm",
                        help="engine to calibrate: vllm, or sglang (its JIT CUDA kernels, built here: needs a GPU, "
                        "nvcc, ninja and tvm-ffi)")
    parser.add_argument("--mode", default=None, choices=("default", "eager"),
                        help="vllm: default = native ops under Inductor (-O2), eager = its CUDA kernels "
                        "(enforce_eager); sglang has one mode, default (its CUDA path). Default: default; "
                        "with --live it must be given (with --engine-outputs: the saved run's)")
    parser.add_argument("--wheel", default=None,
                        help="engine wheel file to load the code from (default: the installed package, else "
                        "the engine's wheel in rla's engine cache, $RLA_ENGINE_CACHE or ~/.cache/rla/engines)")
    parser.add_argument("--engine-version", default=None,
                        help="which version's wheel to take from the engine cache (or to --download); "
                        "default: the newest there")
    parser.add_argument("--download", action="store_true",
                        help="when the engine is neither installed nor in the cache, pip-download its wheel "
                        "(--no-deps; vLLM's is ~330 MB) into the engine cache")
    parser.add_argument("--allow-native-eager", action="store_true",
                        help="write an eager-mode profile even where the engine's kernels cannot run (no GPU): "
                        "its points then come from the native ops run eagerly, which are not the kernels "
                        "(named <engine>-<version>-eager-native)")
    parser.add_argument("--library", default=None,
                        help="vLLM kernel library (_C_stable_libtorch.abi3.so, or .xz of it) for --mode eager")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--scale", default=None, choices=("small", "full"),
                        help="probe set (default: full on cuda, small on cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="profile JSON to write (default rla-calibrate/<engine>-<mode>.json); "
                        "reports go beside it as <stem>.report.json / .report.md")
    parser.add_argument("--name", default=None, help="profile name (default <engine>-<major.minor>[-<mode>])")
    add_live_arguments(parser, "512,2048,4096")
    parser.add_argument("--model", default=None, type=model_path,
                        help=f"--live: the HF checkpoint folder the engine and the search run (Qwen2, Qwen3, Llama), "
                        f"or {MODEL_HELP}")
    parser.add_argument("--start", default=None,
                        help="--live: the row the search starts from (a name or a profile JSON file); default: the "
                        "row calibrated for the installed version and mode, else the nearest calibrated row")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out file and its reports (refused otherwise, before any work)")


def _wheel(args, say) -> str | None:
    """The wheel to load: --wheel; else None when the engine is installed (and no other version was
    asked for); else the cache's; else, with --download, a fresh download into the cache."""
    from rla.engines.source import EngineNotFound, cache_dir, cached_wheel, download_wheel
    from rla.profiles import installed_version

    from rla.engines.adapter import ENGINES

    if args.engine not in ENGINES:
        raise ValueError(f"unknown engine {args.engine!r}; supported: {', '.join(ENGINES)}")
    if args.wheel is not None:
        return args.wheel
    installed = installed_version(args.engine)
    if installed is not None and args.engine_version in (None, installed):
        return None
    wheel = cached_wheel(args.engine, args.engine_version)
    if wheel is None and args.download:
        say(f"downloading {args.engine}{'==' + args.engine_version if args.engine_version else ''} into {cache_dir()}")
        wheel = download_wheel(args.engine, args.engine_version)
    if wheel is None:
        which = f"{args.engine} {args.engine_version}" if args.engine_version else args.engine
        raise EngineNotFound(
            f"{which} is not installed in this Python and its wheel is not in rla's engine cache ({cache_dir()}); "
            f"pass --download to fetch it there (pip download --no-deps), or --wheel FILE"
        )
    say(f"using {wheel} (rla's engine cache)")
    return str(wheel)


def run(args) -> int:
    from rla.commands._live import check_live

    from rla.commands.calibrate_live import OP_FLAGS

    check_live(args, OP_FLAGS, "the op-level calibration")
    if args.live:
        if args.model is None:
            raise ValueError("--live needs --model PATH: the HF checkpoint folder the engine runs")
        from rla.commands.calibrate_live import run as run_live

        return run_live(args)
    for dest, flag in (("model", "--model"), ("start", "--start")):
        if getattr(args, dest):
            raise ValueError(f"{flag}: only used with --live (the op-level calibration runs no model); "
                             "add --live or drop it")
    args.mode = args.mode or "default"
    return _run_ops(args)


def _run_ops(args) -> int:
    import shlex
    import sys
    import time

    import torch

    from pathlib import Path

    from rla.commands.calibrate_live import check_out
    from rla.engines.calibrate import calibrate
    from rla.engines.conformance import kernels_ran, markdown, write

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.mode == "eager" and device == "cpu" and not args.allow_native_eager:
        print(f"rla calibrate: --mode eager on the CPU cannot run {args.engine}'s kernels; its points would come "
              "from the native ops run eagerly, which round differently (not the engine's eager row). Run it on a "
              "GPU (--device cuda), or pass --allow-native-eager to write that native row anyway", file=sys.stderr)
        return 2
    out = args.out or f"rla-calibrate/{args.engine}-{args.mode}.json"
    check_out(out, args.overwrite, also=[f"{Path(out).with_suffix('')}.report.md"])  # before the engine's code loads
    start = time.monotonic()

    def say(message: str) -> None:
        print(f"[rla calibrate {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    wheel = _wheel(args, say)
    command = "rla " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] else "rla calibrate"
    conf = calibrate(
        args.engine, args.mode, wheel=wheel, device=device, library=args.library,
        scale=args.scale, seed=args.seed, command=command, progress=say,
    )
    say("done")
    if conf.mode == "eager" and not kernels_ran(conf) and not args.allow_native_eager:
        paths = write(conf, out, args.name, profile=False)
        print(markdown(conf).split("## Engine code that ran")[0].rstrip())
        print()
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        print(f"no profile written: the engine's kernels did not run here (every point's evidence is weaker than "
              f"'kernel'), so this is not its eager row; see the notes. --allow-native-eager writes it anyway")
        return 1
    paths = write(conf, out, args.name)
    print(markdown(conf).split("## Engine code that ran")[0].rstrip())
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if "profile" not in paths:
        print("no profile written: a point is undecided (see the report)")
        return 1
    return 0
