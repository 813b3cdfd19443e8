"""``rla diagnose --model PATH --rollouts FILE``: attribute a user's mismatch to regions."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="HF checkpoint folder (local files only)")
    parser.add_argument("--rollouts", required=True, help="rollout records, JSONL (docs/rollouts.md)")
    parser.add_argument("--profile", default="auto", help="engine profile of the rollouts, or 'auto' (default)")
    parser.add_argument("--out", default="rla-report", help="report folder (default rla-report/)")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=16384, help="tokens per micro-batch")


def run(args) -> int:
    import torch
    from rich.console import Console

    from rla import rollouts
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.report import explain, rich_tables, write_report
    from rla.hf import load_model
    from rla.profiles import get

    if args.profile != "auto":
        get(args.profile)
    model = load_model(args.model, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float16, device=args.device)
    records = rollouts.load(args.rollouts, vocab_size=model.config.vocab_size)
    console = Console()
    d = diagnose(model, records, args.profile, max_tokens=args.max_tokens, progress=True)
    for t in rich_tables(d):
        console.print(t)
    write_report(d, args.out)
    console.print(explain(d))
    console.print(f"report written to {args.out}/")
    return 0
