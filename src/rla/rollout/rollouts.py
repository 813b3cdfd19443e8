"""Rollout records: a versioned JSONL format for sampled responses and their engine logprobs.

Mismatch is measured between two numbers for the same token: the inference engine's logprob
(recorded here at sampling time) and the training stack's (recomputed later from ``to_padded``).
This module is the hand-off between the two, so it is strict: a record either carries everything
needed to recompute the same distribution, or ``load`` refuses it with the file, line and field.

Format ``rla.rollout/1``: one JSON object per line, UTF-8, ``\\n``-terminated::

    {"format":"rla.rollout/1","prompt_ids":[151644,872,198],"response_ids":[40,1079,151645],
     "logprobs":[-0.0123,-1.5,-0.0001],"temperature":1.0,"top_p":1.0,"top_k":-1,"engine":"vllm",
     "reward":1.0,"metadata":{"task":"gsm8k/17"}}

(one line in the file; wrapped here). Fields:

* ``prompt_ids`` (list[int], at least one token: the first response token's logit is read at the
  last prompt position) and ``response_ids`` (list[int], non-empty); ids are ``>= 0`` and, when
  ``load`` gets ``vocab_size``, ``< vocab_size``.
* ``logprobs`` (list[float], one per response token): the engine's log-probability of the sampled
  token **after** temperature and top-k/top-p processing, i.e. under the distribution it sampled
  from. Finite and ``<= 1e-6``: engines print ``-0.0`` or tiny positive rounding for near-certain
  tokens, so values up to ``1e-6`` are accepted and kept exactly as written.
* ``temperature`` (float > 0; greedy decoding is not a sampling policy), ``top_p`` (in (0, 1]),
  ``top_k`` (int; ``-1`` means disabled, ``0`` is accepted as vLLM's other spelling of disabled
  and stored as ``-1``).
* ``engine`` (non-empty str: ``"vllm"``, ``"sglang"`` or an ``rla`` profile name).
* optional ``engine_version`` (non-empty str, the engine's release, e.g. ``"0.33.0"``: what
  ``profile="vllm"`` resolves by, :func:`rla.profiles.for_engine`), ``policy`` (which weights
  sampled the rollout: ``{"weights": "rla-weights/1:<32 hex>", "step": 3}``, the fingerprint of
  :func:`rla.rollout.fingerprint.weights_fingerprint`, whose rule tag versions it, and optionally
  the trainer's optimizer step; ``rla diagnose`` compares it with the checkpoint), ``reward``
  (finite float) and ``metadata`` (JSON object); left out when None.
* optional ``routes`` (MoE models; for routing replay, ``rla.alignment.replay``): an object
  ``{"version": 1, "experts": [...], "weights": [...]}``. ``experts`` has one entry per token of
  ``prompt_ids + response_ids`` (or one fewer: the last sampled token never went through the
  engine's forward), each a list per MoE layer (in layer order) of the k expert ids the engine
  routed that token to, in its slot order; ``weights`` (optional, where the engine returns them)
  has the same shape, the routing weights (finite). Ids are distinct within a slot list and
  ``>= 0``; every position has the same number of layers and k.

* optional ``top_logprobs`` (version 1): the engine's top-k (or whole) distribution per response
  token, and optionally per prompt token, as ``[token_id, logprob]`` pairs, with ``complete``
  saying whether the lists are the whole distribution: :mod:`rla.rollout.top_logprobs`. A record
  without it reads and writes as before.

Unknown keys are an error (put extras in ``metadata``), as is an unknown ``format``: a later
version will get a new tag rather than a silently different meaning. Non-standard JSON constants
(``NaN``, ``Infinity``) are rejected. Trailing blank lines are fine; a blank line between records
is an error (it usually means files were spliced). Floats round-trip exactly: JSON is written
with Python's shortest ``repr``.

Producing records from vLLM
    Create the engine with ``LLM(model, logprobs_mode="processed_logprobs")`` (the default
    ``raw_logprobs`` is the log-softmax of the unscaled logits, which is the sampling distribution
    only at temperature 1 without top-k/top-p). Sample with ``SamplingParams(temperature=T,
    top_p=p, top_k=k, logprobs=0)``: ``logprobs=0`` returns just the sampled token's logprob. For
    each ``RequestOutput`` ``out`` and each completion ``c`` in ``out.outputs``:
    ``prompt_ids = out.prompt_token_ids``, ``response_ids = c.token_ids``, ``logprobs =
    [c.logprobs[j][tok].logprob for j, tok in enumerate(c.token_ids)]`` (one dict per position,
    keyed by token id), and ``temperature/top_p/top_k`` as passed, ``engine="vllm"``,
    ``engine_version=importlib.metadata.version("vllm")``.

Producing records from SGLang
    Send ``return_logprob=True`` with the request (a request argument beside
    ``sampling_params``, not inside it). ``out["meta_info"]["output_token_logprobs"]`` is a list
    of ``(logprob, token_id, text_or_None)`` tuples, one per generated token: ``response_ids`` are
    the token ids, ``logprobs`` the first elements. Temperature: by default SGLang returns the
    logprob after temperature scaling; with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` it returns the
    untempered one, which is only right for ``temperature=1``. Check whether your version
    renormalises after top-k/top-p; if not, record ``top_p=1.0, top_k=-1`` runs for mismatch
    measurements (or say so in ``metadata``). ``engine="sglang"``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rla import strict_json
from rla.atomic import atomic_file
from rla.errors import UserError
from rla.rollout import top_logprobs
from rla.strict_json import short

__all__ = [
    "FORMAT", "RolloutRecord", "RolloutFormatError", "save", "load", "iter_load", "to_padded",
]

#: Format tag written on every line; ``load`` reads only this version.
FORMAT = "rla.rollout/1"
#: Positive logprobs up to this are engine rounding, not errors.
POSITIVE_LOGPROB_TOL = 1e-6
_REQUIRED = ("prompt_ids", "response_ids", "logprobs", "temperature", "top_p", "top_k", "engine")
_OPTIONAL = ("engine_version", "policy", "reward", "metadata", "routes", "top_logprobs")
_POLICY_KEYS = ("weights", "step")
#: The versions of the optional ``routes`` field this module reads.
ROUTES_VERSIONS = (1,)


class RolloutFormatError(ValueError, UserError):
    """A record or rollout file is invalid; the message names the file, line and field."""

    def __init__(self, problem: str, *, path: Any = None, line: int | None = None,
                 field: str | None = None, record: int | None = None):
        self.problem, self.path, self.line, self.field = problem, path, line, field
        self.record = record
        where = ""
        if path is not None:
            where = f"{os.fspath(path)}:" + (f"{line}:" if line is not None else "") + " "
        if record is not None:
            where += f"record {record}: "
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}{what}{problem}")

    def at(self, path: Any, line: int) -> RolloutFormatError:
        return RolloutFormatError(self.problem, path=path, line=line, field=self.field)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    """A number that is finite as a float (a 400-digit int is not: it has no float)."""
    try:
        return _is_number(v) and math.isfinite(v)
    except OverflowError:
        return False


_MAX_INT = 2**31 - 1  # token ids and top_k beyond this fit no vocabulary and no tensor index


def _ids(name: str, v: Any, vocab_size: int | None) -> list[int]:
    if not isinstance(v, (list, tuple)):
        raise RolloutFormatError(f"expected a list of ints, got {type(v).__name__}", field=name)
    if not v:
        raise RolloutFormatError("must not be empty", field=name)
    for j, t in enumerate(v):
        if not _is_int(t) or t < 0:
            raise RolloutFormatError(f"element {j} is {short(t)}, not a non-negative int", field=name)
        if vocab_size is not None and t >= vocab_size:
            raise RolloutFormatError(f"element {j} is {short(t)} >= vocab_size {vocab_size}", field=name)
        if t > _MAX_INT:
            raise RolloutFormatError(f"element {j} is {short(t)}, out of range for a token id (> {_MAX_INT})",
                                     field=name)
    return list(v)


def _number(name: str, v: Any) -> float:
    if not _finite(v):
        raise RolloutFormatError(f"expected a finite number, got {short(v)}", field=name)
    return float(v)


def _policy(v: Any) -> dict[str, Any] | None:
    """The optional ``policy`` field: ``{"weights": fingerprint, "step": int >= 0 (optional)}``."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise RolloutFormatError(f"expected an object such as {{\"weights\": \"rla-weights/1:...\", \"step\": 3}}, "
                                 f"got {type(v).__name__}", field="policy")
    unknown = sorted(set(v) - set(_POLICY_KEYS))
    if unknown:
        raise RolloutFormatError(f"unknown key(s) {unknown}; it holds 'weights' and optionally 'step'", field="policy")
    if "weights" not in v:
        raise RolloutFormatError("missing 'weights' (the fingerprint of the weights that sampled the rollout, "
                                 "rla.rollout.fingerprint.weights_fingerprint)", field="policy")
    from rla.rollout.fingerprint import parse

    try:
        parse(v["weights"])
    except ValueError as err:
        raise RolloutFormatError(f"'weights': {err}", field="policy") from None
    out = {"weights": v["weights"]}
    if "step" in v:
        step = v["step"]
        if not _is_int(step) or not 0 <= step <= 2**63 - 1:
            raise RolloutFormatError(f"'step': expected an int >= 0 (the trainer's optimizer step), got {short(step)}",
                                     field="policy")
        out["step"] = step
    return out


def _validate(d: dict[str, Any], vocab_size: int | None = None) -> dict[str, Any]:
    """Check one record's fields; return them normalised (floats as float, top_k 0 -> -1)."""
    out: dict[str, Any] = {}
    out["prompt_ids"] = _ids("prompt_ids", d["prompt_ids"], vocab_size)
    out["response_ids"] = _ids("response_ids", d["response_ids"], vocab_size)
    lps = d["logprobs"]
    if not isinstance(lps, (list, tuple)):
        raise RolloutFormatError(f"expected a list of floats, got {type(lps).__name__}",
                                 field="logprobs")
    if len(lps) != len(out["response_ids"]):
        raise RolloutFormatError(
            f"{len(lps)} logprobs for {len(out['response_ids'])} response tokens", field="logprobs"
        )
    for j, lp in enumerate(lps):
        if not _finite(lp):
            raise RolloutFormatError(f"element {j} is {short(lp)}, not a finite number",
                                     field="logprobs")
        if lp > POSITIVE_LOGPROB_TOL:
            raise RolloutFormatError(
                f"element {j} is {lp!r} > {POSITIVE_LOGPROB_TOL}; a log-probability is <= 0",
                field="logprobs",
            )
    out["logprobs"] = [float(lp) for lp in lps]
    out["temperature"] = _number("temperature", d["temperature"])
    if out["temperature"] <= 0:
        raise RolloutFormatError(f"must be > 0, got {d['temperature']!r}", field="temperature")
    out["top_p"] = _number("top_p", d["top_p"])
    if not 0 < out["top_p"] <= 1:
        raise RolloutFormatError(f"must be in (0, 1], got {d['top_p']!r}", field="top_p")
    top_k = d["top_k"]
    if not _is_int(top_k) or not -1 <= top_k <= _MAX_INT:
        raise RolloutFormatError(f"must be an int >= 1 (at most {_MAX_INT}), or -1/0 (disabled), got {short(top_k)}",
                                 field="top_k")
    out["top_k"] = -1 if top_k == 0 else top_k
    if not isinstance(d["engine"], str) or not d["engine"]:
        raise RolloutFormatError(f"expected a non-empty string, got {d['engine']!r}",
                                 field="engine")
    out["engine"] = d["engine"]
    version = d.get("engine_version")
    if version is not None and (not isinstance(version, str) or not version):
        raise RolloutFormatError(f"expected a non-empty version string such as '0.33.0', got {version!r}",
                                 field="engine_version")
    out["engine_version"] = version
    out["policy"] = _policy(d.get("policy"))
    reward = d.get("reward")
    out["reward"] = None if reward is None else _number("reward", reward)
    meta = d.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise RolloutFormatError(f"expected an object, got {type(meta).__name__}", field="metadata")
    out["metadata"] = meta
    routes = d.get("routes")
    out["routes"] = None if routes is None else _routes(routes, len(out["prompt_ids"]) + len(out["response_ids"]))
    top = d.get("top_logprobs")
    try:
        out["top_logprobs"] = None if top is None else top_logprobs.check(
            top, len(out["response_ids"]), len(out["prompt_ids"]), vocab_size)
    except ValueError as err:
        raise RolloutFormatError(str(err), field="top_logprobs") from None
    return out


def _routes(r: Any, n: int) -> dict[str, Any]:
    """Check a ``routes`` object (module docstring) for a record of ``n`` tokens."""
    def bad(problem):
        return RolloutFormatError(problem, field="routes")

    if not isinstance(r, dict) or set(r) - {"version", "experts", "weights"} or "experts" not in r:
        raise bad("expected an object with 'version', 'experts' and optionally 'weights'")
    if r.get("version") not in ROUTES_VERSIONS or isinstance(r.get("version"), bool):
        raise bad(f"version {short(r.get('version'))} is not one this rla reads {ROUTES_VERSIONS}")
    experts = r["experts"]
    if not isinstance(experts, list) or len(experts) not in (n, n - 1):
        raise bad(f"'experts' must have one entry per token ({n}, or {n - 1} without the last sampled "
                  f"token), got {len(experts) if isinstance(experts, list) else type(experts).__name__}")
    shape = None
    for t, layers in enumerate(experts):
        if not isinstance(layers, list) or not layers or not all(isinstance(s, list) and s for s in layers):
            raise bad(f"'experts'[{t}] must be a non-empty list (per MoE layer) of non-empty id lists")
        here = (len(layers), len(layers[0]))
        shape = shape or here
        if here != shape or any(len(s) != shape[1] for s in layers):
            raise bad(f"'experts'[{t}] has {here[0]} layers of k={here[1]}, position 0 {shape[0]} of k={shape[1]}")
        for slots in layers:
            if not all(_is_int(e) and 0 <= e <= _MAX_INT for e in slots) or len(set(slots)) != len(slots):
                raise bad(f"'experts'[{t}] has {short(slots)}: expert ids are distinct ints >= 0")
    weights = r.get("weights")
    if weights is not None:
        ok = isinstance(weights, list) and len(weights) == len(experts) and all(
            isinstance(layers, list) and len(layers) == shape[0]
            and all(isinstance(s, list) and len(s) == shape[1] and all(_finite(v) for v in s) for s in layers)
            for layers in weights)
        if not ok:
            raise bad("'weights' must have the shape of 'experts' with finite numbers")
        weights = [[[float(v) for v in s] for s in layers] for layers in weights]
    out = {"version": r["version"], "experts": [[list(s) for s in layers] for layers in experts]}
    if weights is not None:
        out["weights"] = weights
    return out


@dataclass
class RolloutRecord:
    """One sampled response with the engine's per-token logprobs; validated on construction.

    See the module docstring for the meaning of each field. Construction normalises the values
    (ints in ``logprobs`` become floats, ``top_k=0`` becomes ``-1``) and raises
    ``RolloutFormatError`` naming the field on any invalid value.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    temperature: float
    top_p: float
    top_k: int
    engine: str
    reward: float | None = None
    metadata: dict[str, Any] | None = None
    engine_version: str | None = None
    policy: dict[str, Any] | None = None
    routes: dict[str, Any] | None = None
    top_logprobs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, value in _validate(self.__dict__).items():
            setattr(self, name, value)


def _to_line(rec: RolloutRecord, index: int) -> str:
    if not isinstance(rec, RolloutRecord):
        raise RolloutFormatError(f"a {type(rec).__name__}, not a RolloutRecord", record=index)
    try:
        d = _validate(rec.__dict__)  # fields are mutable: re-check before writing
    except RolloutFormatError as err:
        raise RolloutFormatError(err.problem, field=err.field, record=index) from None
    obj = {"format": FORMAT, **{k: d[k] for k in _REQUIRED}}
    obj.update({k: d[k] for k in _OPTIONAL if d[k] is not None})
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise RolloutFormatError("nested too deeply to write as JSON", field="metadata", record=index) from None
    except (TypeError, ValueError) as err:
        raise RolloutFormatError(f"not JSON-serialisable ({err})", field="metadata",
                                 record=index) from None


def save(path: str | os.PathLike[str], records: Iterable[RolloutRecord]) -> None:
    """Write records atomically: a crash leaves the old file (or none), never a half file.

    Lines go to a temporary file in the destination folder, which is fsync'ed and then renamed over
    ``path`` (:func:`rla.atomic.atomic_file`). On any error the temporary file is removed. An
    existing file keeps its permission bits; a new one gets 0o644.
    """
    count = 0
    with atomic_file(path) as f:
        for count, rec in enumerate(records, start=1):
            f.write(_to_line(rec, count - 1) + "\n")
        if count == 0:
            raise RolloutFormatError("no records to save (an empty rollout file is invalid)")


def _parse(raw: bytes, path: Any, lineno: int, last: bool, vocab_size: int | None) -> RolloutRecord:
    truncated = " (the last line has no newline: the file looks truncated)" if last else ""
    try:
        obj = strict_json.loads(raw.decode("utf-8"))
    except strict_json.DuplicateKeyError as err:
        raise RolloutFormatError(f"key {err.key!r} appears twice in the record; one would silently replace the "
                                 "other, so it is refused: remove one", path=path, line=lineno) from None
    except (UnicodeDecodeError, ValueError) as err:
        raise RolloutFormatError(f"not valid JSON: {err}{truncated}",
                                 path=path, line=lineno) from None
    if not isinstance(obj, dict):
        raise RolloutFormatError(f"expected a JSON object, got {type(obj).__name__}",
                                 path=path, line=lineno)
    if "format" not in obj:
        raise RolloutFormatError(f"missing; every line carries \"format\": \"{FORMAT}\"",
                                 path=path, line=lineno, field="format")
    if obj["format"] != FORMAT:
        raise RolloutFormatError(f"unsupported format {obj['format']!r}; this rla reads {FORMAT!r}",
                                 path=path, line=lineno, field="format")
    unknown = sorted(set(obj) - {"format", *_REQUIRED, *_OPTIONAL})
    if unknown:
        raise RolloutFormatError(f"unknown field(s) {unknown}; put extras in 'metadata'",
                                 path=path, line=lineno, field=unknown[0])
    for name in _REQUIRED:
        if name not in obj:
            raise RolloutFormatError("missing", path=path, line=lineno, field=name)
    try:
        d = _validate(obj, vocab_size)
        return RolloutRecord(**d)
    except RolloutFormatError as err:
        raise err.at(path, lineno) from None


def iter_load(
    path: str | os.PathLike[str], vocab_size: int | None = None
) -> Iterator[RolloutRecord]:
    """Stream records from ``path``, validating each line; raises at the first invalid line.

    Reads in binary and decodes each line, so invalid UTF-8 is reported with its line number too.
    """
    if vocab_size is not None and (not _is_int(vocab_size) or vocab_size <= 0):
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    first_blank: int | None = None
    count = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            body = raw.rstrip(b"\r\n")
            if not body.strip():
                first_blank = first_blank or lineno
                continue
            if first_blank is not None:
                raise RolloutFormatError("blank line between records", path=path, line=first_blank)
            count += 1
            yield _parse(body, path, lineno, not raw.endswith(b"\n"), vocab_size)
    if count == 0:
        raise RolloutFormatError("no records (empty file)", path=path)


def load(path: str | os.PathLike[str], vocab_size: int | None = None) -> list[RolloutRecord]:
    """All records of ``path`` (see ``iter_load``); an empty file is an error."""
    return list(iter_load(path, vocab_size))


def to_padded(
    records: list[RolloutRecord], pad_id: int = 0, vocab_size: int | None = None
) -> dict[str, Any]:
    """Batch records for a training-side forward; responses are aligned at one column.

    Layout: prompts are **left**-padded to ``P = max prompt length`` and responses **right**-padded
    to ``R = max response length``, so response token j of every row sits at column ``P + j`` and
    its logit is read at column ``P + j - 1``. ``position_ids`` are explicit (0 at each row's first
    real token), so left padding does not shift RoPE phases.

    Returns torch tensors ``input_ids`` [B, P+R] (long, ``pad_id`` in padding), ``attention_mask``
    [B, P+R] (long 0/1), ``position_ids`` [B, P+R] (long), ``response_mask`` [B, R] (bool),
    ``rollout_logprobs`` [B, R] (float64, the recorded values exactly, 0 in padding),
    ``temperature``/``top_p`` [B] (float64), ``top_k`` [B] (long, -1 = disabled), and the plain
    int ``response_start`` = P.

    With ``vocab_size`` (the model's), every prompt and response id and ``pad_id`` must be
    ``< vocab_size``: an embedding lookup past the table is an index error on CPU and undefined
    on some GPU paths, and records built in memory were never checked against a vocabulary.
    """
    import torch  # keeps load/save usable without importing torch

    if not records:
        raise ValueError("to_padded needs at least one record")
    if not _is_int(pad_id) or pad_id < 0:
        raise ValueError(f"pad_id must be a non-negative int, got {pad_id!r}")
    if vocab_size is not None:
        if not _is_int(vocab_size) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if pad_id >= vocab_size:
            raise ValueError(f"pad_id {pad_id} >= vocab_size {vocab_size}")
        for i, rec in enumerate(records):
            for name in ("prompt_ids", "response_ids"):
                try:
                    _ids(name, getattr(rec, name), vocab_size)
                except RolloutFormatError as err:
                    raise RolloutFormatError(err.problem, field=name, record=i) from None
    B = len(records)
    P = max(len(r.prompt_ids) for r in records)
    R = max(len(r.response_ids) for r in records)
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + R), dtype=torch.long)
    response_mask = torch.zeros((B, R), dtype=torch.bool)
    rollout_logprobs = torch.zeros((B, R), dtype=torch.float64)
    for i, rec in enumerate(records):
        p, r = len(rec.prompt_ids), len(rec.response_ids)
        if len(rec.logprobs) != r:
            raise RolloutFormatError(f"{len(rec.logprobs)} logprobs for {r} tokens",
                                     field="logprobs", record=i)
        input_ids[i, P - p : P] = torch.tensor(rec.prompt_ids, dtype=torch.long)
        input_ids[i, P : P + r] = torch.tensor(rec.response_ids, dtype=torch.long)
        attention_mask[i, P - p : P + r] = 1
        response_mask[i, :r] = True
        rollout_logprobs[i, :r] = torch.tensor(rec.logprobs, dtype=torch.float64)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "rollout_logprobs": rollout_logprobs,
        "temperature": torch.tensor([r.temperature for r in records], dtype=torch.float64),
        "top_p": torch.tensor([r.top_p for r in records], dtype=torch.float64),
        "top_k": torch.tensor([r.top_k for r in records], dtype=torch.long),
        "response_start": P,
    }
