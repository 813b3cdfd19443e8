"""``rla diagnose --model PATH --rollouts FILE``: attribute a user's mismatch to regions, if it is rounding.

Exit status: 0 when the mismatch is of rounding's size and is attributed: the verdict ``rounding``
when the records' ``policy`` fingerprints are the checkpoint's, ``rounding_weights_unverified``
when they do not say which weights sampled them (then it is not called rounding: the attribution
holds only if those weights are the checkpoint's, and the last line says so); 3 when the verdict is
that it is not (beyond rounding, or the profile increases it), with the reason printed; 2 for bad
input. report.json ``verdict.kind`` tells the two kinds of 0 apart (``verdict.ok`` is true only
for ``rounding``).
"""

from __future__ import annotations

from rla.commands._args import MODEL_HELP, model_path, positive_float, positive_int


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, type=model_path,
                        help=f"HF checkpoint folder (local files only), or {MODEL_HELP}")
    parser.add_argument("--rollouts", required=True, help="rollout records, JSONL (docs/rollouts.md)")
    parser.add_argument("--profile", default="auto", help="engine profile of the rollouts, or 'auto' (default)")
    parser.add_argument("--out", default="rla-report", help="report folder (default rla-report/; must be new or empty)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--max-tokens", type=positive_int, default=None,
                        help="tokens per forward step (default 16384, or from --memory-budget); a longer record runs "
                        "as a chunked prefill where that is bit-identical")
    parser.add_argument("--memory-budget", type=positive_float, default=None, metavar="GIB",
                        help="GiB for one forward step's activations and LM-head chunk; sets what --max-tokens does not")


def run(args) -> int:
    from pathlib import Path

    import torch
    from rla.console import console as make_console

    from rla.rollout import rollouts
    from rla.commands._args import check_device
    from rla.diagnosis.core import diagnose
    from rla.diagnosis.output import check_out_dir
    from rla.diagnosis.provenance import inputs_record, recheck
    from rla.diagnosis.report import explain, long_inputs_text, rich_tables, write_report
    from rla.hf import load_model
    from rla.profiles import get

    if args.profile != "auto":
        get(args.profile)
    check_device(args.device)
    if not Path(args.rollouts).is_file():
        raise FileNotFoundError(f"--rollouts {args.rollouts}: no such file")
    check_out_dir(args.out, overwrite=args.overwrite, inputs=[args.model, args.rollouts])
    # hashed before the work and checked again after it: report.json names the bytes diagnosed
    if not Path(args.model).is_dir():
        raise FileNotFoundError(f"--model {args.model}: no such folder (rla never downloads from a hub)")
    inputs = inputs_record(model_path=args.model, rollouts_path=args.rollouts, profile=args.profile)
    model = load_model(args.model, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float16, device=args.device)
    records = rollouts.load(args.rollouts, vocab_size=model.config.vocab_size)
    console = make_console()
    budget = None if args.memory_budget is None else max(1, int(args.memory_budget * 2**30))
    d = diagnose(model, records, args.profile, max_tokens=args.max_tokens, memory_budget=budget, progress=True)
    for t in rich_tables(d):
        console.print(t)
    recheck(inputs)  # a file changed mid-run is an error naming it, not a report of bytes never diagnosed
    inputs["profile"] = d.profile
    write_report(d, args.out, inputs=inputs, overwrite=args.overwrite)
    console.print(explain(d))
    if long_inputs_text(d):
        console.print(long_inputs_text(d), highlight=False)
    console.print(f"report written to {args.out}/")
    if d.verdict is not None and not d.verdict.attributed:
        console.print(f"[bold red]rla diagnose: not attributed:[/] {d.verdict.message}", highlight=False)
        return 3
    if d.verdict is not None and not d.verdict.ok:
        console.print(f"[bold yellow]rla diagnose: {d.verdict.kind}:[/] rounding-sized, but the records do not say "
                      "which weights sampled them; the attribution holds only if this checkpoint's did (add a "
                      "`policy` field to the records to check it: docs/rollouts.md)", highlight=False)
    return 0
