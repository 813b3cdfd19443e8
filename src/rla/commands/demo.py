"""``rla demo``: sample from the bundled model under an engine profile and diagnose the mismatch."""

from __future__ import annotations

from rla.commands._args import positive_float, positive_int


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="rla-demo", help="report folder (default rla-demo/; must be new or empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    parser.add_argument("-n", type=positive_int, default=128, help="rollouts to sample (default 128, at least 2)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None, help="response cap (default: task's)")
    parser.add_argument("--difficulty", type=positive_int, default=None, help="task difficulty (longer responses)")
    parser.add_argument("--profile", default="vllm", help="rollout engine profile (default vllm)")
    parser.add_argument("--temperature", type=positive_float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--no-detect", action="store_true", help="skip profile detection")
    parser.add_argument("--ignore-eos", action="store_true", help="sample past eos up to --max-new-tokens (vLLM's ignore_eos)")


def run(args) -> int:
    from rla.commands._args import check_device
    from rla.demo import DemoConfig, run_demo
    from rla.diagnosis.output import check_out_dir
    from rla.profiles import get

    get(args.profile)  # unknown names fail here, listing the known ones
    if args.n < 2:
        raise ValueError(f"-n must be at least 2, got {args.n}")
    check_device(args.device)
    from rla.models import bundled_path

    check_out_dir(args.out, overwrite=args.overwrite, inputs=[bundled_path()])
    d = run_demo(
        DemoConfig(
            out=args.out, n=args.n, max_new_tokens=args.max_new_tokens, profile=args.profile,
            temperature=args.temperature, seed=args.seed, detect=not args.no_detect,
            device=args.device, difficulty=args.difficulty, ignore_eos=args.ignore_eos,
            overwrite=args.overwrite,
        )
    )
    return 0 if d.verdict is None or d.verdict.attributed else 3
