"""The frameworks' own rollout data, read into rla rollout records: verl, TRL, OpenRLHF, vLLM.

Each reader takes what the framework itself writes or holds and returns a :class:`Dump`: the
records (:class:`rla.rollout.rollouts.RolloutRecord`, validated as any record is), the
framework trainer's own logprobs of the same tokens where the data carries them (verl's
``old_log_probs``, OpenRLHF's ``action_log_probs``, TRL's ``old_per_token_logps``), the rows whose
position ids are not what their attention mask implies, and every field of the input that is not
in the records, named with the reason (``unused``). A field a record needs that is missing or
unreadable is a :class:`DumpFormatError` naming the file, the row and the field; nothing is dropped
without being named.

What each framework writes, read from its own code (versions the tests run):

- **verl 0.9.1.** ``trainer.rollout_data_dir`` (``RayPPOTrainer._write_generations``) writes
  ``{step}.jsonl`` lines of *decoded text*: ``input``, ``output``, ``gts``, ``score``, ``step``
  and the reward's extra infos. It carries no token ids and no logprobs, so no record can be made
  from it; :func:`read_verl` refuses it naming the missing fields. The batch itself, a
  ``DataProto`` (written by ``DataProto.save_to_disk``, as verl's ``RolloutSkip`` dumps a
  generation batch to ``skip.rollout.dump_dir``), holds ``prompts`` (left-padded), ``responses``
  (right-padded), ``response_mask``, ``attention_mask``, ``position_ids``, ``rollout_log_probs``
  (with ``actor_rollout_ref.rollout.calculate_log_probs=True``) and, once the actor has scored
  the batch, ``old_log_probs``; ``meta_info["temperature"]`` is the rollout temperature the actor
  scores with. Reading a pickled ``DataProto`` runs Python's unpickler on the file: read dumps you
  wrote.
- **TRL 1.16.** ``log_completions=True`` writes ``completions/completions_{step:05d}.parquet``
  (``GRPOTrainer.log``) with ``step``, ``prompt``, ``completion``, one column per reward
  function, the columns logged through ``log_extra`` and ``advantage``: text again. With
  ``rla.integrations.trl.attach(trainer, log_tokens=True)`` the same table gains the columns
  :data:`TRL_COLUMNS` (token ids, TRL's ``sampling_per_token_logps`` and
  ``old_per_token_logps``), written by TRL's own writer; :func:`read_trl` reads them and refuses a
  table without them. With ``use_vllm`` (no PEFT, ZeRO-3 or FSDP) it also gains
  :data:`TRL_POLICY_COLUMNS`, the fingerprint of the weights TRL synced to vLLM for each row and
  the global step, read into the records' ``policy``. A ``rollout_func``'s output (``prompt_ids``, ``completion_ids``,
  ``logprobs``, TRL's required keys) is read by :func:`from_trl_rollout`.
- **OpenRLHF 0.11.2.** ``Experience`` (``trainer/ppo_utils/experience.py``): ``sequences`` [B, T]
  prompt and response, ``action_mask`` [B, T-1] (column t marks ``sequences[:, t+1]`` as an
  action), ``rollout_log_probs`` and ``action_log_probs`` [B, T-1] on the same columns.
- **vLLM 0.26.** ``RequestOutput.prompt_token_ids`` and, per ``CompletionOutput``, ``token_ids``
  and ``logprobs``: a list with one ``{token_id: Logprob}`` dict per position, or a
  ``FlatLogprobs`` (``flat_logprobs=True``), whose positions index the same way. The value means
  what ``logprobs_mode`` says (``raw_logprobs`` by default: before temperature / top-k / top-p);
  the records say ``metadata["logprobs_mode"]``, which the triage reads.

The sampling settings (temperature, top-p, top-k) are in none of these dumps except verl's
temperature, so the caller gives them (:class:`Sampling`); a verl temperature that contradicts
the given one is an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rla.errors import UserError
from rla.rollout.rollouts import RolloutFormatError, RolloutRecord

__all__ = ["Sampling", "Dump", "DumpFormatError", "read_verl", "from_verl_batch", "read_trl",
           "from_trl_rollout", "from_openrlhf", "read_openrlhf", "from_vllm", "read", "SOURCES",
           "TRL_COLUMNS", "TRL_POLICY_COLUMNS", "VERL_TEXT_FIELDS"]

#: The columns ``rla.integrations.trl.attach(..., log_tokens=True)`` adds to TRL's completions table.
TRL_COLUMNS = ("rla/prompt_ids", "rla/completion_ids", "rla/sampling_logprobs", "rla/old_logprobs")
#: The two it adds where it can say which weights sampled each row (``use_vllm``), read into ``policy``.
TRL_POLICY_COLUMNS = ("rla/policy", "rla/policy_step")
#: What verl 0.9.1's ``_write_generations`` writes on every rollout_data_dir line.
VERL_TEXT_FIELDS = ("input", "output", "gts", "score", "step")


class DumpFormatError(ValueError, UserError):
    """A framework dump cannot be read into records; the message names the file, row and field."""

    def __init__(self, problem: str, *, path: Any = None, row: int | None = None, field: str | None = None):
        where = f"{os.fspath(path)}: " if path is not None else ""
        if row is not None:
            where += f"row {row}: "
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}{what}{problem}")


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of the run (no dump carries them all) and the engine that sampled."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    engine: str = "vllm"
    engine_version: str | None = None


@dataclass
class Dump:
    """Records read from a framework's data, and what was not put into them."""

    source: str
    records: list[RolloutRecord]
    trainer_logprobs: list[list[float]] | None = None
    """The framework trainer's own logprobs of each record's response tokens, when the data has them."""
    trainer_field: str | None = None
    bad_positions: list[int] = field(default_factory=list)
    """Rows whose position ids differ from ``cumsum(attention_mask) - 1`` over their real tokens."""
    unused: dict[str, str] = field(default_factory=dict)
    """Input field -> why it is not in the records."""


def _settings(s: Sampling, path, temperature=None) -> dict:
    t = s.temperature
    if temperature is not None:
        if t is not None and float(t) != float(temperature):
            raise DumpFormatError(f"the dump's temperature is {temperature}, the given one {t}",
                                  path=path, field="meta_info.temperature")
        t = temperature
    missing = [n for n, v in (("temperature", t), ("top_p", s.top_p), ("top_k", s.top_k)) if v is None]
    if missing:
        raise DumpFormatError("the dump does not carry the sampling settings " + ", ".join(missing)
                              + ": give them (rla triage --temperature/--top-p/--top-k)", path=path,
                              field=missing[0])
    return dict(temperature=float(t), top_p=float(s.top_p), top_k=int(s.top_k), engine=s.engine,
                engine_version=s.engine_version)


def _record(path, row, settings, prompt, response, logprobs, reward=None, metadata=None, policy=None) -> RolloutRecord:
    try:
        return RolloutRecord(prompt_ids=[int(x) for x in prompt], response_ids=[int(x) for x in response],
                             logprobs=[float(x) for x in logprobs], reward=reward, metadata=metadata, policy=policy,
                             **settings)
    except RolloutFormatError as err:
        raise DumpFormatError(err.problem, path=path, row=row, field=err.field) from None


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _span(mask_row: np.ndarray, path, row: int, name: str) -> tuple[int, int]:
    """(first, end) of the one contiguous run of 1s in a mask row; holes are an error."""
    on = np.flatnonzero(mask_row)
    if on.size == 0:
        raise DumpFormatError("no token is marked: an empty response cannot be a record", path=path, row=row,
                              field=name)
    first, end = int(on[0]), int(on[-1]) + 1
    if on.size != end - first:
        raise DumpFormatError(f"the marked tokens are {on.size} of columns {first}..{end - 1}, not one run "
                              "(multi-turn with tool or observation tokens between turns): an rla record "
                              "holds one response; split the turns", path=path, row=row, field=name)
    return first, end


# ----------------------------------------------------------------------------- verl


def read_verl(path, sampling: Sampling = Sampling()) -> Dump:
    """A verl dump: a pickled ``DataProto`` (``DataProto.save_to_disk``); a rollout_data_dir JSONL
    is refused naming what it lacks."""
    with open(path, "rb") as f:
        head = f.read(1)
    if head in (b"{", b"["):
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        try:
            keys = sorted(json.loads(first))
        except (ValueError, TypeError):
            raise DumpFormatError("starts like JSON but its first line does not parse", path=path) from None
        raise DumpFormatError(
            f"a verl rollout_data_dir line (fields {', '.join(keys)}) holds decoded text, written by "
            "RayPPOTrainer._write_generations: no prompt/response token ids and no rollout_log_probs or "
            "old_log_probs, so no record can be made from it (tokenizing the text again does not give the "
            "sampled tokens). Dump the batch instead: batch.save_to_disk(PATH) after the actor's "
            "compute_log_prob, or skip.rollout.enable=True (its dump_dir holds the generation batch)",
            path=path, field="rollout_log_probs")
    try:
        from verl.protocol import DataProto
    except ImportError as err:
        raise DumpFormatError(f"a pickled verl DataProto needs verl to read ({err})", path=path) from None
    data = DataProto.load_from_disk(path)
    return from_verl_batch(data, sampling, path=path)


_VERL_USED = ("prompts", "responses", "response_mask", "attention_mask", "position_ids", "input_ids",
              "rollout_log_probs", "old_log_probs", "rm_scores", "token_level_scores")


def from_verl_batch(data, sampling: Sampling = Sampling(), *, path=None) -> Dump:
    """Records from a verl ``DataProto`` batch (see the module docstring for its layout)."""
    batch = data.batch
    keys = set(batch.keys()) if batch is not None else set()
    for name in ("prompts", "responses", "attention_mask", "rollout_log_probs"):
        if name not in keys:
            extra = (" (set actor_rollout_ref.rollout.calculate_log_probs=True)" if name == "rollout_log_probs"
                     else "")
            raise DumpFormatError(f"missing from the batch (it has {', '.join(sorted(keys))}){extra}",
                                  path=path, field=name)
    prompts, responses = _array(batch["prompts"]), _array(batch["responses"])
    attn, roll = _array(batch["attention_mask"]), _array(batch["rollout_log_probs"]).astype(np.float64)
    P, R = prompts.shape[1], responses.shape[1]
    rmask = _array(batch["response_mask"]) if "response_mask" in keys else attn[:, P:]
    old = _array(batch["old_log_probs"]).astype(np.float64) if "old_log_probs" in keys else None
    scores = next((_array(batch[k]) for k in ("rm_scores", "token_level_scores") if k in keys), None)
    for name, arr, shape in (("attention_mask", attn, (len(prompts), P + R)), ("rollout_log_probs", roll, (len(prompts), R)),
                             ("response_mask", rmask, (len(prompts), R))) + ((("old_log_probs", old, (len(prompts), R)),)
                                                                               if old is not None else ()):
        if arr.shape != shape:
            raise DumpFormatError(f"shape {tuple(arr.shape)}, expected {shape} (prompts {P} + responses {R} columns)",
                                  path=path, field=name)
    settings = _settings(sampling, path, (data.meta_info or {}).get("temperature"))
    pos = _array(batch["position_ids"]) if "position_ids" in keys else None
    records, trainer, bad = [], [] if old is not None else None, []
    for i in range(len(prompts)):
        p0, p1 = _span(attn[i, :P], path, i, "attention_mask")
        if p1 != P:
            raise DumpFormatError(f"the prompt ends at column {p1}, not at {P}: verl left-pads prompts",
                                  path=path, row=i, field="attention_mask")
        r0, r1 = _span(rmask[i], path, i, "response_mask")
        if r0 != 0:
            raise DumpFormatError(f"the response starts at column {r0}, not 0", path=path, row=i, field="response_mask")
        reward = float(scores[i].sum()) if scores is not None else None
        records.append(_record(path, i, settings, prompts[i, p0:], responses[i, :r1], roll[i, :r1], reward,
                               {"verl_row": i}))
        if old is not None:
            trainer.append([float(x) for x in old[i, :r1]])
        if pos is not None and pos.ndim == 2:
            real = attn[i] == 1
            if not np.array_equal(pos[i][real], np.cumsum(attn[i])[real] - 1):
                bad.append(i)
    unused = {k: "not part of a rollout record" for k in sorted(keys - set(_VERL_USED))}
    if pos is not None and pos.ndim != 2:
        unused["position_ids"] = f"{pos.ndim}-D (multimodal RoPE positions): not checked"
    for k in sorted(getattr(data, "non_tensor_batch", {}) or {}):
        unused[k] = "non-tensor field, not part of a rollout record"
    return Dump("verl", records, trainer, "old_log_probs" if old is not None else None, bad, unused)


# ----------------------------------------------------------------------------- TRL


def from_trl_rollout(output: dict, sampling: Sampling, *, path=None, policies=None) -> Dump:
    """Records from a TRL ``rollout_func`` output: ``prompt_ids``, ``completion_ids``, ``logprobs``
    (TRL's required keys), one list per completion; other keys are named in ``unused``.
    ``policies``: each completion's ``policy`` field (which weights sampled it), or None."""
    for name in ("prompt_ids", "completion_ids", "logprobs"):
        if name not in output:
            raise DumpFormatError("missing (TRL's rollout_func must return prompt_ids, completion_ids and "
                                  "logprobs)", path=path, field=name)
    p, c, lp = output["prompt_ids"], output["completion_ids"], output["logprobs"]
    if not len(p) == len(c) == len(lp):
        raise DumpFormatError(f"{len(p)} prompt_ids, {len(c)} completion_ids, {len(lp)} logprobs rows", path=path)
    settings = _settings(sampling, path)
    records = []
    for i in range(len(p)):
        row = [float("nan") if x is None else x for x in lp[i]]
        if len(row) != len(c[i]):
            raise DumpFormatError(f"{len(row)} logprobs for {len(c[i])} completion tokens", path=path, row=i,
                                  field="logprobs")
        if any(x != x for x in row):
            raise DumpFormatError("NaN logprob (a token vLLM could not score; TRL keeps it as NaN): such a "
                                  "token has no engine logprob to compare", path=path, row=i, field="logprobs")
        records.append(_record(path, i, settings, p[i], c[i], row, policy=None if policies is None else policies[i]))
    unused = {k: "rollout_func extra field, not part of a rollout record" for k in output
              if k not in ("prompt_ids", "completion_ids", "logprobs")}
    return Dump("trl", records, None, None, [], unused)


def read_trl(path, sampling: Sampling) -> Dump:
    """TRL's completions parquet with the :data:`TRL_COLUMNS` (``attach(..., log_tokens=True)``)."""
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises its own types for a damaged file
        raise DumpFormatError(f"not a readable parquet file ({type(err).__name__}: {err})", path=path) from None
    missing = [c for c in TRL_COLUMNS[:3] if c not in df.columns]
    if missing:
        raise DumpFormatError(
            f"TRL's completions table (columns {', '.join(map(str, df.columns))}) holds decoded text; token ids "
            "and sampling logprobs are in it only with rla.integrations.trl.attach(trainer, log_tokens=True)",
            path=path, field=missing[0])
    out = {"prompt_ids": list(df["rla/prompt_ids"]), "completion_ids": list(df["rla/completion_ids"]),
           "logprobs": [list(x) for x in df["rla/sampling_logprobs"]]}
    policies = None
    if "rla/policy" in df.columns:  # the weights TRL synced to vLLM for each row (attach's log_tokens)
        steps = df["rla/policy_step"] if "rla/policy_step" in df.columns else [None] * len(df)
        policies = [{"weights": str(fp)} | ({} if st is None else {"step": int(st)})
                    for fp, st in zip(df["rla/policy"], steps)]
    dump = from_trl_rollout(out, sampling, path=path, policies=policies)
    if "rla/old_logprobs" in df.columns:
        dump.trainer_logprobs = [[float(x) for x in row] for row in df["rla/old_logprobs"]]
        dump.trainer_field = "old_per_token_logps"
    dump.unused = {str(c): "completions-table column, not part of a rollout record" for c in df.columns
                   if c not in TRL_COLUMNS + TRL_POLICY_COLUMNS}
    return dump


# ----------------------------------------------------------------------------- OpenRLHF


def from_openrlhf(experiences, sampling: Sampling, *, path=None) -> Dump:
    """Records from OpenRLHF ``Experience`` objects (one or a list; each may hold several rows)."""
    if not isinstance(experiences, (list, tuple)):
        experiences = [experiences]
    settings = _settings(sampling, path)
    records, trainer, row = [], [], 0
    have_actor = all(getattr(e, "action_log_probs", None) is not None for e in experiences)
    for e in experiences:
        for name in ("sequences", "action_mask", "rollout_log_probs"):
            if getattr(e, name, None) is None:
                raise DumpFormatError("missing from the Experience (rollout_log_probs needs vLLM logprobs: "
                                      "--enable_vllm_is_correction or a logprob-returning agent)"
                                      if name == "rollout_log_probs" else "missing from the Experience",
                                      path=path, row=row, field=name)
        seq, amask = _array(e.sequences), _array(e.action_mask)
        roll = _array(e.rollout_log_probs).astype(np.float64)
        act = _array(e.action_log_probs).astype(np.float64) if have_actor else None
        attn = _array(e.attention_mask) if e.attention_mask is not None else np.ones_like(seq)
        for i in range(len(seq)):
            a0, a1 = _span(amask[i], path, row, "action_mask")
            s0, _ = _span(attn[i], path, row, "attention_mask")
            prompt, response = seq[i, s0:a0 + 1], seq[i, a0 + 1:a1 + 1]
            reward = None if e.rewards is None else float(_array(e.rewards)[i])
            records.append(_record(path, row, settings, prompt, response, roll[i, a0:a1], reward))
            if act is not None:
                trainer.append([float(x) for x in act[i, a0:a1]])
            row += 1
    used = {"sequences", "action_mask", "attention_mask", "rollout_log_probs", "action_log_probs", "rewards"}
    names = sorted({k for e in experiences for k, v in vars(e).items()
                    if k not in used and v is not None and not (isinstance(v, (list, dict)) and not v)})
    return Dump("openrlhf", records, trainer if have_actor else None,
                "action_log_probs" if have_actor else None, [], {k: "not part of a rollout record" for k in names})


def read_openrlhf(path, sampling: Sampling) -> Dump:
    """A ``torch.save``'d Experience or list of them (unpickled: read files you wrote)."""
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise DumpFormatError(f"not a torch.save file of OpenRLHF Experiences ({type(err).__name__}: {err})",
                              path=path) from None
    return from_openrlhf(obj, sampling, path=path)


# ----------------------------------------------------------------------------- vLLM


def _position_logprob(pos, token: int):
    """The sampled token's logprob at one position: a ``{id: Logprob}`` dict (vLLM's
    ``LogprobsOnePosition``) or FlatLogprobs' per-position view, which is that dict too."""
    if pos is None or token not in pos:
        return None
    entry = pos[token]
    return getattr(entry, "logprob", entry)


def _top(c, out, prompt, vocab_size):
    """The record's ``top_logprobs`` (rla.rollout.top_logprobs) from a completion's positions and the
    request's ``prompt_logprobs``, or None when every position holds the sampled token alone
    (``logprobs=0``). Complete when ``vocab_size`` is given and every position lists that many
    tokens (``logprobs=-1``, or k at least the vocabulary)."""
    from rla.rollout.top_logprobs import from_positions

    positions = list(c.logprobs)
    if all(len(pos) <= 1 for pos in positions):
        return None
    top = {"version": 1, "complete": vocab_size is not None and all(len(pos) >= vocab_size for pos in positions),
           "response": from_positions(positions)}
    prompt_lps = getattr(out, "prompt_logprobs", None)
    if prompt_lps is not None and len(prompt_lps) == len(prompt) and len(prompt) > 1:
        rest = list(prompt_lps)[1:]
        top["complete"] = top["complete"] and all(len(pos) >= vocab_size for pos in rest)
        top["prompt"] = from_positions(rest)
    return top


def from_vllm(outputs, sampling: Sampling, *, logprobs_mode: str = "raw_logprobs", vocab_size: int | None = None) -> Dump:
    """Records from vLLM ``RequestOutput`` objects (``SamplingParams(logprobs=0)`` or more).

    With ``logprobs=k`` (k >= 1) or ``-1``, each position's other tokens become the record's
    ``top_logprobs`` (and ``prompt_logprobs=k``'s, its ``prompt`` lists): the full-vocabulary
    comparison (``rla.metrics.vocab_kl``). ``vocab_size``: the model's; lists that long are
    marked complete (the KL is then exact, else a lower bound)."""
    settings = _settings(sampling, None)
    records, row = [], 0
    for out in outputs:
        prompt = getattr(out, "prompt_token_ids", None)
        if prompt is None:
            raise DumpFormatError("missing (None: a request given as text with no token ids kept)", row=row,
                                  field="prompt_token_ids")
        for c in out.outputs:
            if c.logprobs is None:
                raise DumpFormatError("None: sample with SamplingParams(logprobs=0) to get the sampled tokens' "
                                      "logprobs", row=row, field="logprobs")
            ids = list(c.token_ids)
            if len(c.logprobs) != len(ids):
                raise DumpFormatError(f"{len(c.logprobs)} positions for {len(ids)} tokens", row=row, field="logprobs")
            lps = []
            for j, tok in enumerate(ids):
                lp = _position_logprob(c.logprobs[j], tok)
                if lp is None:
                    raise DumpFormatError(f"position {j} has no logprob for its sampled token {tok}", row=row,
                                          field="logprobs")
                lps.append(lp)
            rec = _record(None, row, settings, prompt, ids, lps, None,
                          {"logprobs_mode": logprobs_mode, "request_id": str(out.request_id)})
            top = _top(c, out, prompt, vocab_size)
            if top is not None:
                try:
                    rec = dataclasses.replace(rec, top_logprobs=top)
                except RolloutFormatError as err:
                    raise DumpFormatError(err.problem, row=row, field=err.field) from None
            records.append(rec)
            row += 1
    return Dump("vllm", records)


# ----------------------------------------------------------------------------- dispatch

SOURCES = ("verl", "trl", "openrlhf", "vllm")


def read(source: str, path, sampling: Sampling, *, logprobs_mode: str = "raw_logprobs",
         vocab_size: int | None = None) -> Dump:
    """Read ``path`` as ``source`` writes it (``rla triage --from SOURCE PATH``). vLLM's outputs
    are read from a ``torch.save``'d or pickled list of ``RequestOutput`` objects; for TRL, a
    ``.json`` file is a ``rollout_func``'s output dict, anything else the completions parquet."""
    if source not in SOURCES:
        raise DumpFormatError(f"unknown source {source!r}; known: {', '.join(SOURCES)}")
    if not os.path.isfile(path):
        raise DumpFormatError("no such file", path=path)
    if source == "verl":
        return read_verl(path, sampling)
    if source == "trl":
        if os.fspath(path).endswith(".json"):  # a rollout_func's output dict, saved with json.dump
            with open(path, encoding="utf-8") as f:
                try:
                    output = json.load(f)
                except ValueError as err:
                    raise DumpFormatError(f"not valid JSON ({err})", path=path) from None
            if not isinstance(output, dict):
                raise DumpFormatError("a rollout_func output is one JSON object of lists", path=path)
            return from_trl_rollout(output, sampling, path=path)
        return read_trl(path, sampling)
    if source == "openrlhf":
        return read_openrlhf(path, sampling)
    import torch

    try:
        outputs = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise DumpFormatError(f"not a saved list of vLLM RequestOutputs ({type(err).__name__}: {err})",
                              path=path) from None
    return from_vllm(outputs, sampling, logprobs_mode=logprobs_mode, vocab_size=vocab_size)
