"""``rla calibrate``: measure where an engine rounds, from its own code, into a profile file."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--engine", default="vllm",
                        help="engine to calibrate: vllm, or sglang (its JIT CUDA kernels, built here: needs a GPU, "
                        "nvcc, ninja and tvm-ffi)")
    parser.add_argument("--mode", default="default", choices=("default", "eager"),
                        help="vllm: default = native ops under Inductor (-O2), eager = its CUDA kernels "
                        "(enforce_eager); sglang has one mode, default (its CUDA path)")
    parser.add_argument("--wheel", default=None, help="engine wheel file to load the code from (default: the installed package)")
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


def run(args) -> int:
    import shlex
    import sys

    import torch

    from rla.engines.calibrate import calibrate
    from rla.engines.conformance import markdown, write

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    command = "rla " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] else "rla calibrate"
    conf = calibrate(
        args.engine, args.mode, wheel=args.wheel, device=device, library=args.library,
        scale=args.scale, seed=args.seed, command=command,
    )
    out = args.out or f"rla-calibrate/{args.engine}-{args.mode}.json"
    paths = write(conf, out, args.name)
    print(markdown(conf).split("## Engine code that ran")[0].rstrip())
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if "profile" not in paths:
        print("no profile written: a point is undecided (see the report)")
        return 1
    return 0
