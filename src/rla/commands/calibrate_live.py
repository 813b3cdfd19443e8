"""``rla calibrate --engine vllm --live --model PATH --mode default|eager``: a profile row from the
live engine, by a model-level search.

Starts vLLM on the folder, takes its prompt logprobs and sampled tokens (as ``rla verify --live``),
closes it, and runs :func:`rla.engines.live_calibration.search` from the row calibrated for the
installed version and mode (or the nearest calibrated row; ``--start`` names another). Writes the
found row (``rla.engines.live_profile``: ``vllm-0.26`` / ``vllm-0.26-eager``, ``live`` evidence,
the start and found rows' bit-equal fractions and k3, the engine settings, the model's shape) in
the profile format, and beside it ``<stem>.report.json`` with every row the search tried and each
point's flip. An existing file, or a name a built-in row has, is refused unless ``--overwrite``
(files) or ``--name`` (the row's name).
"""

from __future__ import annotations

import dataclasses

import json
import shlex
import sys
import time
from pathlib import Path

__all__ = ["run", "write_row", "report_path"]

#: Flags of the op-level path (dest -> (flag, value when not given)); refused with --live.
OP_FLAGS = {"wheel": ("--wheel", None), "engine_version": ("--engine-version", None),
            "download": ("--download", False), "allow_native_eager": ("--allow-native-eager", False),
            "library": ("--library", None), "device": ("--device", None), "scale": ("--scale", None)}


def report_path(out) -> Path:
    return Path(f"{Path(out).with_suffix('')}.report.json")


def check_out(out, overwrite: bool, also=()) -> None:
    """The row file, its report and the files ``also`` names (the op-level calibration's
    ``.report.md``) must not exist unless ``overwrite``; ``out`` names a .json file, not a folder."""
    for path in (Path(out), report_path(out), *map(Path, also)):
        if path.is_dir():
            raise IsADirectoryError(f"--out {out}: {path} is a folder; --out names the profile file (.json)")
        if path.exists() and not overwrite:
            raise FileExistsError(f"--out {out}: {path} exists; choose another --out or pass --overwrite to replace it")
    if Path(out).suffix != ".json":
        raise ValueError(f"--out {out}: a profile file is .json")


def write_row(row, search_report: dict, out, *, overwrite: bool) -> dict[str, Path]:
    """The row (profile JSON) and its report, each written atomically; checked again just before."""
    from rla.atomic import write_text
    from rla.profiles import load, to_dict

    check_out(out, overwrite)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rep = report_path(out)
    write_text(rep, json.dumps(search_report, indent=1) + "\n")
    write_text(out, json.dumps(to_dict(row), indent=2) + "\n")
    load(out)  # what was written reads back as a valid row
    return {"profile": out, "report_json": rep}


def _start(args, version: str):
    from rla import profiles

    if args.start:
        return profiles.load(args.start) if Path(args.start).suffix == ".json" else profiles.get(args.start)
    alias = args.engine if args.mode == "default" else f"{args.engine}-{args.mode}"
    return profiles.for_engine(alias, version, warn=False).profile


def run(args) -> int:
    import torch

    from rla import profiles
    from rla.commands._live import check_model, engine_data, engine_side, run_length, saved_engine, weigh
    from rla.engines.live_calibration import search
    from rla.engines.live_points import family_kind, set_in, values
    from rla.engines.live_profile import live_name, live_row, settle
    from rla.engines.vllm_live import installed_version
    from rla.hf import load_model

    if args.engine != "vllm":
        raise ValueError(f"--live --engine {args.engine}: the live adapter runs vLLM only")
    saved = saved_engine(args)
    if args.mode is None:
        raise ValueError("--live: name the engine's mode, --mode default (-O2 compile, CUDA graphs) or --mode eager")
    if saved is None:
        args.prompt_tokens = args.prompt_tokens or [512, 2048, 4096]
        args.responses = args.responses or 4
        args.max_new_tokens = args.max_new_tokens or 128
    if args.out is not None:  # before the engine's version is known: the out path alone
        check_out(args.out, args.overwrite)
    longest = run_length(args, saved)
    info = check_model(args.model, longest)
    settings, attention, attending, version, device = engine_side(args, saved, longest, "engine", info)
    name = args.name or live_name(args.engine, version, args.mode)
    if name in profiles.names():
        raise ValueError(f"a built-in row is named {name!r}: give this live row another name (--name)")
    out = args.out or f"rla-calibrate/{name}.json"
    check_out(out, args.overwrite)
    start_row = _start(args, version)
    t0 = time.monotonic()

    def say(message: str) -> None:
        print(f"[rla calibrate --live {time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    data = engine_data(args, saved, settings, info["vocab_size"], say)
    say(f"searching the points from {start_row.name}, the training side attending with the {attention} attention "
        f"({device})")
    model = load_model(args.model, dtype=torch.bfloat16, device=device)
    data = weigh(data, saved, model, f"--engine-outputs {args.engine_outputs}")
    with attending(model):
        best, best_score, tried, flips = search(model, start_row, data.prompts, data.prompt_logprobs, data.records,
                                                say)
        best, best_score = settle(model, start_row, best, best_score, flips, data.prompts, data.prompt_logprobs,
                                  data.records)
    data = dataclasses.replace(data, engine={**data.engine, "settings": {**data.engine.get("settings", {}),
                                                                         "train_attention": attention}})
    command = "rla " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] \
        else "rla calibrate --live"
    from rla.environment import environment

    env = environment(torch.device(device))
    gpu = torch.cuda.get_device_name() if device == "cuda" else env["gpu"]
    row = live_row(data.engine, start_row, tried[0], best, best_score, flips, info, date=env["date"],
                   gpu=gpu, torch=torch.__version__, command=command,
                   results=report_path(out).name, name=name)
    kind = family_kind(model)
    paths = write_row(row, {"format": "rla.live_calibration/1", "engine": data.engine, "model": info,
                            "installed": installed_version(), "start": start_row.name,
                            "family_kind": kind, "best": values(model, best), "best_row_points": best.points(),
                            "set_in_variant": set_in(best, kind), "score": best_score, "start_score": tried[0],
                            "flips": flips, "tried": tried, "environment": env}, out, overwrite=args.overwrite)
    print(summary(row, start_row, flips))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def summary(row, start, flips: dict | None = None) -> str:
    """Per point (and per variant point the live engine decided): the start row's value, the live
    row's, its evidence and note, as the model's family computes them: a value its kind's variant sets
    is the variant's, and says so (``round (qwen3_5 variant)``); then each second kind's point the
    search flipped (``flips``' ``moe_experts.moe_out``; without ``flips``, those with live evidence),
    labelled by its kind (``moe_out (moe_experts)``), with the value those modules compute; then the
    scores."""
    from rla.engines.live_points import SECOND_KINDS, family_kind, key, points_of, second_value, set_in, split
    from rla.profiles import VARIANT_POINTS

    live = row.calibration.live
    kind = family_kind((live.get("model") or {}).get("family") or "")
    was, now, inside = points_of(start, kind), points_of(row, kind), set_in(row, kind)
    lines = [f"# {row.name}: live calibration from {start.name}", "",
             "| point | start | live row | evidence | note |", "|---|---|---|---|---|"]
    for p, e in row.calibration.points.items():
        if p in inside:  # the model computes the variant's value: its evidence, the row's own value beside
            by = inside[p]
            e = row.variant_evidence.get(by, {}).get(p) or e
            note = f"{e.note}; the row's own value (other families): {getattr(row, p)}"
            lines.append(f"| {p} | {was[p]} ({set_in(start, kind).get(p, by)} variant) | {now[p]} ({by} variant) | "
                         f"{e.evidence} | {note.replace('|', '/')} |")
            continue
        lines.append(f"| {p} | {was[p]} | {now[p]} | {e.evidence} | {e.note.replace('|', '/')} |")
    for k, evidence in row.variant_evidence.items():  # the variant points the search flipped (Gemma's)
        for p, e in evidence.items():
            if p in VARIANT_POINTS and e.evidence == "live" and k not in SECOND_KINDS:
                lines.append(f"| {p} ({k}) | {start.variant(k).kind_points(k)[p]} | "
                             f"{row.variant(k).kind_points(k)[p]} | live | {e.note.replace('|', '/')} |")
    names = [n for n in flips if split(n)[0]] if flips is not None else [
        key(k, p) for k in SECOND_KINDS for p, e in row.variant_evidence.get(k, {}).items() if e.evidence == "live"]
    for n in names:  # a second kind's points: in its variant, as its modules compute them
        k, p = split(n)
        e = row.variant_evidence.get(k, {}).get(p)
        if e is None:  # not set, as the start had it: say why from the flip
            f = flips[n]
            why = ("does not apply to this model" if f.get("applies") is False
                   else f"not measured: {f['error']}" if "error" in f else "its flip ties")
            evidence, note = "-", f"not set in the {k} variant ({why}), as in {start.name}"
        else:
            evidence, note = e.evidence, e.note
        lines.append(f"| {p} ({k}) | {second_value(start, kind, n)} | {second_value(row, kind, n)} | {evidence} | "
                     f"{note.replace('|', '/')} |")
    for side in ("start", "found"):
        s = live[side]
        lines.append(f"\n{side} ({s['name']}): prefill bit-equal {s['prefill_equal']:.4%} k3 {s['prefill_k3']:.3e}; "
                     f"decode bit-equal {s['decode_equal']:.4%} k3 {s['decode_k3']:.3e}")
    return "\n".join(lines)
