"""``rla demo``: sample from the bundled model under an engine profile and diagnose the mismatch."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="rla-report", help="report folder (default rla-report/)")
    parser.add_argument("-n", type=int, default=128, help="rollouts to sample (default 128)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="response cap (default: task's)")
    parser.add_argument("--difficulty", type=int, default=None, help="task difficulty (longer responses)")
    parser.add_argument("--profile", default="vllm", help="rollout engine profile (default vllm)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-detect", action="store_true", help="skip profile detection")
    parser.add_argument("--ignore-eos", action="store_true", help="sample past eos up to --max-new-tokens (vLLM's ignore_eos)")


def run(args) -> int:
    from rla.demo import DemoConfig, run_demo
    from rla.profiles import get

    get(args.profile)  # unknown names fail here, listing the known ones
    if args.n < 2:
        raise ValueError(f"-n must be at least 2, got {args.n}")
    run_demo(
        DemoConfig(
            out=args.out, n=args.n, max_new_tokens=args.max_new_tokens, profile=args.profile,
            temperature=args.temperature, seed=args.seed, detect=not args.no_detect,
            device=args.device, difficulty=args.difficulty, ignore_eos=args.ignore_eos,
        )
    )
    return 0
