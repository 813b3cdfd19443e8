"""``rla doctor --model PATH``: static precision hazards, each with its fix."""

from __future__ import annotations

from rla.commands._args import MODEL_HELP, model_path


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, type=model_path,
                        help=f"HF checkpoint folder, or {MODEL_HELP}; default: the bundled model")
    parser.add_argument(
        "--cast-bf16", action="store_true",
        help="load in fp32 then call model.to(torch.bfloat16), as many trainers do (shows the inv_freq hazard)",
    )
    parser.add_argument(
        "--adapter", default=None,
        help="a PEFT LoRA adapter folder to load on the model, unmerged, as a LoRA trainer runs it",
    )
    parser.add_argument(
        "--no-engine", action="store_true",
        help="the training model samples its own rollouts (no vLLM/SGLang): skip the engine-only checks",
    )
    parser.add_argument(
        "--profile", default=None,
        help="the engine's row (a name, an alias or a profile JSON file) for the checks that compare the model with "
        "it (the LM head's logits dtype); default: the built-in rows' defaults",
    )
    parser.add_argument(
        "--lm-head", choices=["lp", "fp32"], default=None,
        help="the engine's LM head, where the run set it (fp32: vLLM hf_overrides head_dtype=float32, SGLang "
        "--enable-fp32-lm-head); the row's lm_head point otherwise; alone, applied to the vllm row (docs/rounding.md)",
    )


def run(args) -> int:
    import torch
    from rla.console import console as make_console
    from rich.table import Table

    from rla.diagnosis.doctor import doctor
    from rla.hf import load_model
    from rla.models import bundled_path

    path = args.model or str(bundled_path())
    model = load_model(path, dtype=torch.float32 if args.cast_bf16 else torch.bfloat16)
    if args.cast_bf16:
        model = model.to(torch.bfloat16)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    hazards = doctor(model, external_engine=not args.no_engine, profile=_profile(args))
    console = make_console()
    if not hazards:
        console.print(f"[green]no precision hazards found[/] in {path}")
        return 0
    table = Table(title=f"Precision hazards in {path}")
    for col in ("hazard", "severity", "what", "fix"):
        table.add_column(col, overflow="fold")
    for h in hazards:
        table.add_row(h.name, h.severity, h.detail, h.fix)
    console.print(table)
    return 1 if any(h.severity == "error" for h in hazards) else 0


def _profile(args):
    """The row ``--profile`` names (a JSON file is read), with ``--lm-head`` applied when given."""
    from pathlib import Path

    from rla import profiles

    if args.profile is None and args.lm_head is None:
        return None
    name = args.profile or "vllm"
    row = profiles.load(name) if Path(name).suffix == ".json" else profiles.get(name)
    if args.lm_head is None or args.lm_head == row.lm_head:
        return row
    return row.replace(name=f"{row.name}+lm_head={args.lm_head}", lm_head=args.lm_head)
