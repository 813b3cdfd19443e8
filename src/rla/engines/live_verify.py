"""The live engine against the training side: its own prompt logprobs and sampled tokens, scored by
HF eager and by rla under each candidate row -- what ``rla verify --engine vllm --live`` writes and
``lab/bench/vllm_live_h200.py compare`` stores.

The engine's side is plain data (:class:`EngineData`: prompts, the engine's prompt logprobs,
rollout records with its sampled tokens and their logprobs, the engine's metadata), collected once
from a running engine by :func:`collect`; everything after that (:func:`compare`, :func:`report`,
:func:`render`) needs no engine and runs on any device, so the CPU tests drive it with data an
aligned model produced under a known row. Each side is one forward per sequence, the LM head as
vLLM computes its logprobs (:func:`rla.engines.live_calibration.score`): the bit-equal fraction is
the share of logprobs equal to the engine's in every bit, k3 = E[exp(d) - 1 - d] with
d = log pi_train - log pi_engine in fp64, max |d|; for prefill and decode, and for prefill per
position bucket (:data:`rla.engines.live_calibration.BUCKETS`).

Beside the rows, a report may hold the engine-backed side (:data:`ENGINE_SIDE`): the training
forward with the engine's own code in it (:func:`engine_backed_forward`), scored the same way.

Which rows are candidates is data, not engine branches: for each of the engine's modes, the row
:func:`rla.profiles.for_engine` resolves for the engine's version (calibrated on it, else the
nearest), the running mode's row first; then any row the user names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from rla.alignment.families import FAMILIES
from rla.engines.live_calibration import BUCKETS, score
from rla.profiles import REGIONS, RoundingProfile, for_engine

__all__ = ["EngineData", "FORMAT", "candidates", "random_prompts", "collect", "compare", "model_info",
           "report", "render", "save", "load", "with_weights", "check_weights", "longest", "engine_backed_forward",
           "ENGINE_SIDE", "REPLAYED"]

ENGINE_SIDE = "engine-forward"
"""The name of the engine-backed side in a report (:func:`engine_backed_forward`)."""

FORMAT = "rla.live_verify/1"
"""The ``format`` key of a report (``report.json``)."""

_SHAPE_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "rope_parameters", "tie_word_embeddings")


@dataclass(frozen=True)
class EngineData:
    """What the engine returned: per prompt its logprobs of tokens 1..n-1 (prefill), and its
    sampled responses as rollout records (decode), with the engine's metadata
    (``{"name", "version", "mode", "settings"}``, as :func:`rla.engines.vllm_live.engine_metadata`)."""

    prompts: list[list[int]]
    prompt_logprobs: list[list[float]]
    records: list
    engine: dict
    prompt_routes: list | None = None
    """Per prompt, the experts the engine routed each of its tokens to (``[n][moe_layers][k]``, the
    layout of a record's ``routes["experts"]``), when the engine returned them; the records then carry
    ``routes`` too. What :func:`compare`'s replayed sides route by."""

    def __post_init__(self) -> None:
        if not self.prompts or not self.records:
            raise ValueError("engine data needs at least one prompt (prefill) and one record (decode)")
        if len(self.prompts) != len(self.prompt_logprobs):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.prompt_logprobs)} prompt logprob lists")
        for i, (p, lp) in enumerate(zip(self.prompts, self.prompt_logprobs)):
            if len(lp) != len(p) - 1:
                raise ValueError(f"prompt {i}: {len(p)} tokens need {len(p) - 1} prompt logprobs, got {len(lp)}")
        for key in ("name", "version", "mode"):
            if not isinstance(self.engine.get(key), str):
                raise ValueError(f"engine metadata lacks {key!r} (it has {sorted(self.engine)})")
        if self.prompt_routes is not None:
            _check_prompt_routes(self.prompts, self.prompt_routes)
            missing = [i for i, r in enumerate(self.records) if r.routes is None]
            if missing:
                raise ValueError(f"the prompts have routes but records {missing[:5]} have none: routed engine data "
                                 "carries them for every sequence")

    @property
    def routed(self) -> bool:
        """Whether the engine's routes came with the data (routing replay can be scored)."""
        return self.prompt_routes is not None


def _check_prompt_routes(prompts, routes) -> None:
    if len(routes) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(routes)} prompt route lists")
    shapes = set()
    for i, (p, r) in enumerate(zip(prompts, routes)):
        t = torch.as_tensor(r)
        if t.ndim != 3 or t.shape[0] != len(p) or t.dtype not in (torch.int64, torch.int32) or (t < 0).any():
            raise ValueError(f"prompt {i}: {len(p)} tokens need routes [{len(p)}][moe_layers][k] of expert ids >= 0, "
                             f"got shape {tuple(t.shape)}")
        shapes.add(tuple(t.shape[1:]))
    if len(shapes) != 1:
        raise ValueError(f"the prompts' routes have different (moe_layers, k): {sorted(shapes)}")


def save(folder, data: EngineData) -> None:
    """Write ``data`` as :func:`load` reads it (``engine.json``, ``rollouts.jsonl``) into ``folder``,
    which the caller stages (``rla.diagnosis.output.staged``): nothing here checks for old files."""
    import json
    from pathlib import Path

    from rla.rollout import rollouts

    p = Path(folder)
    d = {"engine": data.engine, "prompts": data.prompts, "prompt_logprobs": data.prompt_logprobs}
    if data.prompt_routes is not None:
        d["prompt_routes"] = data.prompt_routes
    (p / "engine.json").write_text(json.dumps(d) + "\n")
    rollouts.save(p / "rollouts.jsonl", data.records)


def load(folder) -> EngineData:
    """The engine data a report folder holds (``engine.json`` and ``rollouts.jsonl``, as
    ``rla verify --live`` writes them), validated; each problem a one-line error naming the file."""
    from pathlib import Path

    from rla import strict_json
    from rla.rollout import rollouts

    p = Path(folder)
    if not p.is_dir():
        raise FileNotFoundError(f"--engine-outputs {folder}: no such folder (a folder `rla verify --live` wrote)")
    for name in ("engine.json", "rollouts.jsonl"):
        if not (p / name).is_file():
            raise FileNotFoundError(f"--engine-outputs {folder}: no {name}; a folder `rla verify --live` wrote holds "
                                    "engine.json (prompts, prompt logprobs) and rollouts.jsonl (sampled responses)")
    try:
        d = strict_json.loads((p / "engine.json").read_text())
    except ValueError as e:
        raise ValueError(f"{p / 'engine.json'}: not valid JSON: {e}") from None
    if not isinstance(d, dict) or not {"engine", "prompts", "prompt_logprobs"} <= set(d):
        raise ValueError(f"{p / 'engine.json'}: expected an object with 'engine', 'prompts' and 'prompt_logprobs'")
    if not isinstance(d["engine"], dict):
        raise ValueError(f"{p / 'engine.json'}: 'engine' must be an object (the engine's metadata)")
    if set(d) - {"engine", "prompts", "prompt_logprobs", "prompt_routes"}:
        raise ValueError(f"{p / 'engine.json'}: unknown keys {sorted(set(d) - {'engine', 'prompts', 'prompt_logprobs', 'prompt_routes'})}")
    try:
        return EngineData([list(map(int, x)) for x in d["prompts"]], [list(map(float, x)) for x in d["prompt_logprobs"]],
                          rollouts.load(p / "rollouts.jsonl"), d["engine"], d.get("prompt_routes"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"--engine-outputs {folder}: {e}") from None


def longest(data: EngineData) -> int:
    """The longest sequence the training side scores: a prompt, or a record's prompt + response."""
    return max([len(p) for p in data.prompts] + [len(r.prompt_ids) + len(r.response_ids) for r in data.records])


def with_weights(data: EngineData, fingerprint: str) -> EngineData:
    """``data`` saying which weights made it: ``engine["weights"]`` and each record's ``policy``
    (:mod:`rla.rollout.fingerprint`), so a later re-scoring can check it has the same checkpoint."""
    import dataclasses

    records = [dataclasses.replace(r, policy={"weights": fingerprint}) for r in data.records]
    return dataclasses.replace(data, records=records, engine={**data.engine, "weights": fingerprint})


def check_weights(data: EngineData, fingerprint: str, where: str) -> None:
    """Engine data recorded from other weights than ``fingerprint`` is refused: scored against
    another checkpoint, every difference would read as rounding. Data that names no weights passes."""
    said = {data.engine.get("weights")} | {(r.policy or {}).get("weights") for r in data.records}
    said.discard(None)
    if said and said != {fingerprint}:
        raise ValueError(f"{where}: the engine outputs were made from other weights ({', '.join(sorted(said))}) than "
                         f"--model ({fingerprint}); score them with the checkpoint the engine ran")


def _alias(engine: str, mode: str) -> str:
    return engine if mode == "default" else f"{engine}-{mode}"


def candidates(engine: str, version: str, mode: str, modes: tuple[str, ...],
               extra: dict[str, RoundingProfile] | None = None) -> dict[str, RoundingProfile | None]:
    """The sides of a report: ``hf`` (None: the model as HF runs it), then for the running
    ``mode`` and each other of ``modes`` the row calibrated for ``engine`` ``version`` in that mode
    (or the nearest calibrated one), then ``extra`` (name -> row). A row met twice is listed once."""
    sides: dict[str, RoundingProfile | None] = {"hf": None}
    for m in (mode, *(x for x in modes if x != mode)):
        match = for_engine(_alias(engine, m), version, warn=False)
        if match is not None:
            sides.setdefault(match.profile.name, match.profile)
    for name, row in (extra or {}).items():
        if name in sides:
            raise ValueError(f"side {name!r} is already in the report ({', '.join(sides)}): name it otherwise")
        sides[name] = row
    return sides


def engine_backed_forward(engine, mode: str, library: str | None = None):
    """The engine-backed training forward of ``engine``'s code in ``mode``, for ``rla.align(...,
    ops=...)``: ``default``, the twin's compiled pieces split at attention
    (:func:`rla.engines.vllm_forward.engine_forward`; Inductor on CPU or CUDA); ``eager``, the
    engine's kernels per op (:func:`rla.engines.backed.engine_ops`; CUDA only).

    The forward's values are the engine's code; the row only says which gradient the backward
    would take (``rla.ops`` of that row), so a scoring side (no backward) does not depend on it.
    It is the row calibrated on this engine version and mode, else the nearest calibrated one
    (:func:`rla.profiles.for_engine`): a version without a row of its own still gets its forward.

    One per engine's files, mode and library in a process: a second call (a second report, a
    test that made engine data with it) reuses the compiled pieces and the loaded kernel library
    instead of compiling or loading them again."""
    key = (engine.name, engine.version, engine.package.origin, engine.package.location, mode, library)
    if key not in _BACKED:
        _BACKED[key] = _backed(engine, mode, library)
    return _BACKED[key]


_BACKED: dict[tuple, object] = {}


def _backed(engine, mode: str, library: str | None):
    match = for_engine(_alias(engine.name, mode), engine.version, warn=False)
    if match is None:
        raise KeyError(f"no calibrated {engine.name} row in {mode} mode ships with rla: the engine-backed forward "
                       "needs one for its backward")
    if mode == "default":
        from rla.engines.vllm_forward import engine_forward

        return engine_forward(engine, "default", library, profile=match.profile)
    if mode == "eager":
        from rla.engines.backed import engine_ops

        return engine_ops(engine, "eager", library, profile=match.profile)
    raise ValueError(f"the engine-backed forward exists for modes default and eager, not {mode!r}")


def random_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    """Random-token prompts of the given lengths (seeded): every position is scored, none is
    easy, and no tokenizer is needed (the engine runs with ``skip_tokenizer_init``)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in lengths]


def collect(engine, prompts, decode_prompts, *, max_new_tokens: int, seed: int = 1,
            route_layers=None) -> EngineData:
    """Prompt logprobs of ``prompts`` and one sampled response of ``max_new_tokens`` per decode
    prompt, from a running engine (``prompt_logprobs``, ``sample`` and ``metadata`` as
    :class:`rla.engines.vllm_live.LiveVllm` has them), at temperature 1 without truncation.
    ``route_layers`` (the model's MoE decoder layers): the engine's routes of every prompt and record
    too (its ``prefill`` and ``sample(route_layers=)``), for :func:`compare`'s replayed sides."""
    if route_layers is None:
        pre, routes = engine.prompt_logprobs(prompts), None
        records = engine.sample(decode_prompts, max_tokens=max_new_tokens, seed=seed)
    else:
        pre, routes = engine.prefill(prompts, route_layers)
        records = engine.sample(decode_prompts, max_tokens=max_new_tokens, seed=seed, route_layers=route_layers)
    return EngineData([list(p) for p in prompts], pre, records, dict(engine.metadata), routes)


REPLAYED = "+routes"
"""The suffix of a replayed side's name (:func:`compare` with ``replay``)."""


def compare(model, sides: dict[str, RoundingProfile | None], data: EngineData,
            log: Callable[[str], None] | None = None, backed: dict | None = None,
            regions: tuple[str, ...] | None = None, replay: bool = False) -> list[dict]:
    """One row per side: ``side``, ``forward`` (what computes it), ``points`` (the row's; None for
    ``hf`` and for an engine-backed side, whose values are the engine's code), ``regions`` (what a
    row's side aligned), ``prefill`` and ``decode`` statistics against the engine (see the module
    docstring), ``seconds``. ``backed`` maps a side's name to the engine-backed ops
    (:func:`engine_backed_forward`) it is aligned with; its row is then only the backward's
    (``gradient_row``). ``regions``: the regions each row's side aligns (None: ``rla.align``'s
    default; GPT-OSS and GLM-4 MoE leave out the router, docs/families.md). ``replay``: after each
    side, the same side with every MoE block routed to the engine's experts (``rla.replay_routes``
    with the data's routes; the side ``<side>+routes``, ``"routes": "engine"``): its distance to the
    engine is what is left once no token picks other experts than the engine did."""
    if replay and not data.routed:
        raise ValueError("replayed sides need the engine's routes: the engine data has none "
                         "(rla verify --live --replay-routes records them)")
    if replay and backed:
        raise ValueError("replayed sides and an engine-backed side are not scored together: run them apart")
    rows = []
    backed = backed or {}
    unknown = set(backed) - set(sides)
    if unknown:
        raise ValueError(f"engine-backed ops for sides {sorted(unknown)} that are not in the report ({', '.join(sides)})")
    routes = data.prompt_routes if replay else None
    for side, row in sides.items():
        for routed in (False, True) if replay else (False,):
            t0 = time.monotonic()
            ops = backed.get(side)
            if ops is not None and row is None:
                raise ValueError(f"side {side!r}: engine-backed ops need the row of their backward, got None")
            s = score(model, row, data.prompts, data.prompt_logprobs, data.records, ops=ops,
                      regions=None if ops is not None else regions, routes=routes if routed else None)
            if ops is None:
                about = {"forward": "HF eager" if row is None else "rla.ops",
                         "points": row.points() if row is not None else None,
                         "regions": None if row is None else list(regions or REGIONS)}
            else:
                about = {"forward": ops.name, "points": None, "gradient_row": row.name}
            name = side + REPLAYED if routed else side
            rows.append({"side": name, **about, **({"routes": "engine"} if routed else {}), **s,
                         "seconds": round(time.monotonic() - t0, 3)})
            if log is not None:
                log(f"{name:22s} prefill eq {s['prefill']['equal']:.4%} k3 {s['prefill']['k3']:.3e} "
                    f"max {s['prefill']['max_abs']:.2e} | decode eq {s['decode']['equal']:.4%} "
                    f"k3 {s['decode']['k3']:.3e} ({rows[-1]['seconds']:.1f}s)")
    return rows


def model_info(config) -> dict:
    """The model's family and shape, from its HF config (what a report and a live row record)."""
    d = config.to_dict()
    out = {"family": d.get("model_type")}
    out.update({k: d[k] for k in _SHAPE_KEYS[1:] if k in d})
    family = FAMILIES.get(d.get("model_type"))
    out["qk_norm"] = bool(family and family.qk_norm and not (family.qk_norm_optional and not d.get("use_qk_norm")))
    out["attention_bias"] = bool(d.get("attention_bias", d.get("model_type") in ("qwen2", "qwen2_moe")))
    return out


def report(data: EngineData, rows: list[dict], model: dict, environment: dict | None = None) -> dict:
    """The JSON report: the engine (metadata), the model, what was scored, every side's row."""
    return {
        "format": FORMAT,
        "engine": data.engine,
        "model": model,
        "prompt_tokens": [len(p) for p in data.prompts],
        "responses": len(data.records),
        "response_tokens": sum(len(r.response_ids) for r in data.records),
        "rows": rows,
        "environment": environment or {},
    }


def _removed(base: float, k3: float) -> str:
    return "-" if base == 0 else f"{1 - k3 / base:.0%}"


def render(rep: dict) -> str:
    """The report as Markdown: one table of every side (prefill and decode: bit-equal, k3, the
    share of HF eager's k3 removed, max |dlogp|), one of prefill per position bucket."""
    e = rep["engine"]
    rows = rep["rows"]
    hf = next((r for r in rows if r["side"] == "hf"), None)
    lines = [
        f"# {e['name']} {e['version']} live, mode {e['mode']}: {rep['model'].get('family')} "
        f"h{rep['model'].get('hidden_size')} x {rep['model'].get('num_hidden_layers')} layers",
        "",
        f"Prefill: {len(rep['prompt_tokens'])} prompts of {', '.join(map(str, rep['prompt_tokens']))} tokens "
        f"({rows[0]['prefill']['tokens']} logprobs); decode: {rep['responses']} sampled responses "
        f"({rows[0]['decode']['tokens']} logprobs). \"k3 removed\" is against HF eager (side `hf`). The training "
        f"side attends with the {e.get('settings', {}).get('train_attention', 'model')} attention.",
        "",
        "| side | prefill bit-equal | prefill k3 | k3 removed | prefill max abs dlogp | decode bit-equal "
        "| decode k3 | decode k3 removed | decode max abs dlogp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if any(r.get("routes") == "engine" for r in rows):
        lines[4:4] = [f"Sides `<side>{REPLAYED}`: that side with every MoE block routed to the experts the engine chose "
                      "for each token (routing replay, rla.replay_routes): what is left there is not tokens sent "
                      "to other experts.", ""]
    for r in rows:
        if r.get("gradient_row") is not None:
            lines[4:4] = [f"Side `{r['side']}`: {r['forward']}, the engine's own code as the training forward "
                          f"(its backward would be rla.ops' gradient of {r['gradient_row']}; scoring runs none), "
                          f"attending with the same attention as the other sides.", ""]
    for r in rows:
        p, d = r["prefill"], r["decode"]
        base = hf is None or r is hf
        lines.append(
            f"| {r['side']} | {p['equal']:.3%} | {p['k3']:.2e} | {'-' if base else _removed(hf['prefill']['k3'], p['k3'])} "
            f"| {p['max_abs']:.3g} | {d['equal']:.3%} | {d['k3']:.2e} | "
            f"{'-' if base else _removed(hf['decode']['k3'], d['k3'])} | {d['max_abs']:.3g} |")
    buckets = [f"{lo}-{hi}" for lo, hi in BUCKETS if any(f"{lo}-{hi}" in r["prefill"].get("by_position", {})
                                                          for r in rows)]
    lines += ["", "Prefill per position of the scored token (bit-equal / k3):", "",
              "| side | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
    for r in rows:
        by = r["prefill"].get("by_position", {})
        lines.append(f"| {r['side']} | " + " | ".join(
            f"{by[b]['equal']:.3%} / {by[b]['k3']:.2e}" if b in by else "-" for b in buckets) + " |")
    return "\n".join(lines) + "\n"
