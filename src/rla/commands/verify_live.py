"""``rla verify --engine vllm --live --model PATH``: vLLM itself against HF eager and rla's rows.

Starts vLLM's own offline engine on the folder (``rla.engines.vllm_live``), takes its prompt
logprobs (prefill) and sampled responses with their logprobs (decode), closes it, then scores
them with HF eager, with rla under each candidate row and, with ``--engine-forward``, with the
engine-backed forward (the engine's own code in the training forward: the side ``engine-forward``;
``rla.engines.live_verify.engine_backed_forward``), each attending with ``--train-attention``'s
attention (``rla.engines.live_verify``), and writes a report folder: ``report.json`` (every side, prefill and decode, per position), ``report.md`` (the
table printed), ``engine.json`` (the prompts and the engine's prompt logprobs) and
``rollouts.jsonl`` (its records), so a report can be re-scored without the engine.
"""

from __future__ import annotations

import dataclasses

import json
import sys
import time

__all__ = ["run", "publish"]


def publish(rep: dict, data, out, *, overwrite: bool, inputs=()) -> None:
    """The report folder (module docstring), written whole or not at all; a non-empty ``out`` is
    refused unless ``overwrite`` (and then only a folder rla wrote: ``rla.diagnosis.output``)."""
    from rla.diagnosis.output import staged
    from rla.engines.live_verify import render, save

    with staged(out, overwrite=overwrite, inputs=inputs) as tmp:
        (tmp / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
        (tmp / "report.md").write_text(render(rep))
        save(tmp, data)


def _regions(value: str | None, family: str, model: str) -> tuple[str, ...] | None:
    """``--regions`` as a tuple (None: rla.align's default), checked against what rla.align supports
    for the model's family before the engine starts (a refusal after the engine's run would waste it)."""
    from rla.alignment import ALIGN_REGIONS
    from rla.alignment.families import get_family
    from rla.profiles import REGIONS

    regions = None if value is None else tuple(x.strip() for x in value.split(",") if x.strip())
    if regions is not None:
        unknown = [r for r in regions if r not in ALIGN_REGIONS]
        if unknown or not regions:
            raise ValueError(f"--regions {value!r}: expected a comma-separated subset of {', '.join(ALIGN_REGIONS)}")
    fam = get_family(family, f"--model {model}")
    missing = fam.unsupported(regions or REGIONS)
    if missing:
        supported = fam.regions
        raise ValueError(f"--model {model}: rla.align supports the regions {', '.join(supported)} for {family}, not "
                         f"{', '.join(missing)}"
                         f"{'' if regions else ' (the default)'}; pass --regions {','.join(supported)} (docs/families.md)")
    return regions


def _extra(args) -> dict:
    """The sides ``--profile`` adds: comma-separated names or profile JSON files."""
    from pathlib import Path

    from rla import profiles

    rows = {}
    for item in filter(None, (x.strip() for x in (args.profile or "").split(","))):
        row = profiles.load(item) if Path(item).suffix == ".json" else profiles.get(item)
        if row.name in rows:
            raise ValueError(f"--profile names the row {row.name!r} twice")
        rows[row.name] = row
    return rows


def _route_layers(args, saved) -> list[int] | None:
    """``--replay-routes``: the model's MoE decoder layers (where the engine's routes are read), checked
    before the engine starts: a model without an MoE block, saved data without routes, and
    ``--engine-forward`` (not scored with replay) are refused. None without the flag."""
    if not args.replay_routes:
        return None
    if args.engine_forward:
        raise ValueError("--replay-routes with --engine-forward: the engine-backed side is not scored with the "
                         "engine's routes; run them apart")
    if saved is not None and not saved.routed:
        raise ValueError(f"--replay-routes: the engine outputs in {args.engine_outputs} hold no routes (a run "
                         "without --replay-routes); run the engine again with it")
    from rla.hf import meta_model

    from rla.alignment.replay import moe_decoder_layers

    layers = moe_decoder_layers(meta_model(args.model))
    if not layers:
        raise ValueError(f"--replay-routes: --model {args.model} has no MoE block: there are no routes to replay")
    return layers


def run(args) -> int:
    import torch

    from rla.commands._live import check_model, engine_code, engine_data, engine_side, run_length, saved_engine, weigh
    from rla.diagnosis.output import check_out_dir
    from rla.engines.live_verify import ENGINE_SIDE, candidates, compare, engine_backed_forward, report
    from rla.engines.vllm_live import MODES
    from rla.environment import environment
    from rla.hf import load_model

    saved = saved_engine(args)
    if saved is None:
        args.prompt_tokens = args.prompt_tokens or [512, 2048]
        args.responses = args.responses or 8
        args.max_new_tokens = args.max_new_tokens or 128
    out = args.out or f"rla-verify-live/vllm-{args.mode}"
    inputs = [args.model] + ([args.engine_outputs] if saved is not None else [])
    check_out_dir(out, overwrite=args.overwrite, inputs=inputs)
    longest = run_length(args, saved)
    info = check_model(args.model, longest)
    regions = _regions(args.regions, info["family"], args.model)
    route_layers = _route_layers(args, saved)
    extra = _extra(args)
    settings, attention, attending, version, device = engine_side(args, saved, longest, "model", info)
    # the sides are named before the engine starts: a --profile clashing with a row of the report is
    # refused now, not after the engine's run (the engine's name and version are known already)
    sides = candidates(saved.engine["name"] if saved is not None else args.engine, version, args.mode, MODES, extra)
    if args.engine_forward and ENGINE_SIDE in sides:
        raise ValueError(f"--profile names a side {ENGINE_SIDE!r}, the name of --engine-forward's side")
    code = engine_code(args, info, version, device)
    start = time.monotonic()

    def say(message: str) -> None:
        print(f"[rla verify --live {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    data = engine_data(args, saved, settings, info["vocab_size"], say, route_layers)
    say(f"scoring the engine's tokens with HF eager and rla's rows ({attention} attention, {device})")
    model = load_model(args.model, dtype=torch.bfloat16, device=device)
    data = weigh(data, saved, model, f"--engine-outputs {args.engine_outputs}")
    backed = {}
    if code is not None:  # built after the engine ran: eager mode's kernels are the engine's own library
        ops = engine_backed_forward(code, args.mode, args.library)
        sides[ENGINE_SIDE], backed[ENGINE_SIDE] = ops.profile, ops
    with attending(model):  # aligned inside: the engine-backed forward attends with this attention too
        rows = compare(model, sides, data, log=say, backed=backed, regions=regions, replay=args.replay_routes)
    data = dataclasses.replace(data, engine={**data.engine, "settings": {**data.engine.get("settings", {}),
                                                                         "train_attention": attention}})
    rep = report(data, rows, info, environment(torch.device(device)))
    publish(rep, data, out, overwrite=args.overwrite, inputs=inputs)
    from rla.engines.live_verify import render

    print(render(rep))
    print(f"report: {out}/report.json, report.md; the engine's logprobs: {out}/engine.json, rollouts.jsonl")
    return 0
