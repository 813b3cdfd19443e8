"""``rla triage --from verl|trl|openrlhf|vllm|rla PATH --model PATH``: numerics or plumbing?

Reads the framework's own dump (:mod:`rla.rollout.framework_dumps`), runs the checks of
:mod:`rla.diagnosis.triage` in their order and prints each with its evidence, then the dashboard
numbers under each framework's names with its published threshold (:mod:`rla.diagnosis.health`).
Exit status: 0 when nothing but rounding-sized mismatch is found (``rla diagnose`` attributes it;
the verdict ``rounding_weights_unverified`` when not every record names the weights that sampled it),
the verdict's code otherwise (:data:`rla.diagnosis.triage.EXIT_CODES`, 10-20), 2 for bad input.
"""

from __future__ import annotations

from rla.commands._args import MODEL_HELP, model_path, nonnegative_int, positive_float


def add_arguments(parser) -> None:
    parser.add_argument("--from", dest="source", required=True, choices=["verl", "trl", "openrlhf", "vllm", "rla"],
                        help="who wrote PATH: a verl DataProto (save_to_disk), TRL's completions parquet "
                        "(attach(..., log_tokens=True)), torch.save'd OpenRLHF Experiences or vLLM RequestOutputs, "
                        "or rla rollout records (JSONL)")
    parser.add_argument("path", help="the dump")
    parser.add_argument("--model", required=True, type=model_path,
                        help=f"HF checkpoint folder the records were sampled from (local files only), or {MODEL_HELP}")
    parser.add_argument("--temperature", type=positive_float, default=None, help="the rollout's sampling temperature")
    parser.add_argument("--top-p", type=positive_float, default=None, help="the rollout's top-p (1 = off)")
    parser.add_argument("--top-k", type=int, default=None, help="the rollout's top-k (-1 = off)")
    parser.add_argument("--engine", default="vllm", help="the engine that sampled (default vllm)")
    parser.add_argument("--logprobs-mode", default="raw_logprobs",
                        help="vLLM's logprobs_mode the outputs were made with (--from vllm; vLLM's default raw_logprobs)")
    parser.add_argument("--alone", type=nonnegative_int, default=16,
                        help="records scored one at a time for the self-consistency check (a forward each)")
    parser.add_argument("--json", default=None, help="also write the triage as JSON to this file")


def run(args) -> int:
    import json

    import torch
    from rla.console import console as make_console

    from rla.atomic import write_text
    from rla.diagnosis.health import health
    from rla.diagnosis.triage import triage
    from rla.hf import load_model
    from rla.rollout import framework_dumps as F
    from rla.rollout import rollouts

    sampling = F.Sampling(args.temperature, args.top_p, args.top_k, args.engine)
    if args.source == "rla":
        dump = F.Dump("rla", rollouts.load(args.path))
    else:
        dump = F.read(args.source, args.path, sampling, logprobs_mode=args.logprobs_mode,
                      vocab_size=_vocab_size(args.model) if args.source == "vllm" else None)
    console = make_console()
    console.print(f"read {len(dump.records)} records from {args.path} ({dump.source})"
                  + (f"; trainer logprobs: {dump.trainer_field}" if dump.trainer_field else ""), highlight=False)
    for name, why in dump.unused.items():
        console.print(f"  not in the records: {name} ({why})", highlight=False)
    bf16 = load_model(args.model, dtype=torch.bfloat16)
    fp32 = load_model(args.model, dtype=torch.float32)
    t = triage(dump.records, bf16=bf16, fp32=fp32, trainer_logprobs=dump.trainer_logprobs,
               trainer_field=dump.trainer_field, bad_positions=dump.bad_positions, alone=args.alone)
    console.print(t.summary(), highlight=False)
    readings = []
    if dump.trainer_logprobs is not None:
        readings = health(dump.trainer_logprobs, [r.logprobs for r in dump.records])
        console.print(f"dashboard numbers (trainer's {dump.trainer_field} vs the engine's):", highlight=False)
        for r in readings:
            thr = "" if r.threshold is None else f" (threshold {r.threshold:g}: {r.source})"
            console.print(f"  {r.framework:8s} {r.key:42s} {r.value:.4g} {r.verdict}{thr}", highlight=False)
    if args.json:
        out = t.to_dict()
        out["source"], out["unused"] = dump.source, dump.unused
        out["health"] = [r.__dict__ for r in readings]
        write_text(args.json, json.dumps(out, indent=1, allow_nan=False, default=float) + "\n")
    return t.exit_code


def _vocab_size(model: str):
    """The checkpoint's ``vocab_size`` from its config.json, without loading it: vLLM's top-logprob
    lists that long are the whole distribution (the vocabulary KL is then exact). None when the
    file does not say; a missing or unreadable config is named when the model loads."""
    import json
    from pathlib import Path

    try:
        v = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
