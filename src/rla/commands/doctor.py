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
    hazards = doctor(model, external_engine=not args.no_engine)
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
