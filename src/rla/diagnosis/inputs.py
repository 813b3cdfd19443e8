"""What the diagnosis checks in the rollouts before running any forward.

Two things rounding can never produce, found from the records and the model's config alone:

- **positions past ``max_position_embeddings``**: the model was not trained there (RoPE angles it
  never saw, a context window an engine would refuse); a mismatch there says nothing about
  rounding. Refused with the record and its length, before any forward.
- **duplicated records**: an exact copy (same prompt, response, logprobs and sampling settings)
  adds no information (the training forward is deterministic, so the copy's per-token deltas are
  the copy's) but it does add weight: ten copies of one sequence can decide a profile detection.
  Copies are counted once, and the report says how many were dropped.

Two things the records' own fields can contradict, refused before any forward:

- **a temperature below :data:`MIN_TEMPERATURE`** (1e-5, vLLM's ``_SAMPLING_EPS``: below it the
  engines decode greedily): the training logprobs at ``logits / T`` degenerate (at ``1e-30`` every
  token's logprob is 0.0 or ``-inf``), so no comparison with them means anything. Refused naming
  the field and the record's line.
- **an ``engine`` field that names another engine than the profile's row**
  (:func:`check_engine`): the records say ``"sglang"`` and the profile is a vLLM row. The
  engine a record names is read from the profile rows' data (a row name or alias gives its
  ``calibration.engine``; an engine's own name is itself), never from a list of names here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InputCheck", "check_records", "check_engine", "MIN_TEMPERATURE"]

MIN_TEMPERATURE = 1e-5
"""Below this the engines sample greedily (vLLM's ``_SAMPLING_EPS``) and ``logits / T`` degenerates."""


@dataclass(frozen=True)
class InputCheck:
    records: list
    """The records the diagnosis uses: the input with exact copies counted once, in input order."""
    indices: list[int]
    """For each record used, its 0-based index in the input."""
    n_input: int
    duplicates: int
    """Records dropped as exact copies of an earlier record."""
    max_length: int
    """Longest prompt + response, in tokens."""

    def note(self) -> str | None:
        if not self.duplicates:
            return None
        return (
            f"{self.duplicates} of {self.n_input} records are exact copies of earlier records (same prompt, "
            f"response, logprobs and sampling settings) and were counted once: {len(self.records)} sequences used."
        )


def _key(r) -> tuple:
    return (tuple(r.prompt_ids), tuple(r.response_ids), tuple(r.logprobs), r.temperature, r.top_p, r.top_k)


def check_records(model, records) -> InputCheck:
    """Refuse positions the model does not support; count exact duplicates once.

    Raises ``ValueError`` naming the first record (0-based index) longer than the model's
    ``config.max_position_embeddings``.
    """
    records = list(records)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = 0
    for i, r in enumerate(records):
        if r.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"record {i} (line {i + 1} of its rollout file), field 'temperature': {r.temperature!r} is below "
                f"{MIN_TEMPERATURE:g}, where engines decode greedily and the training logprobs at logits / temperature "
                "degenerate (every token 0.0 or -inf): that is bad input, not rounding. Record the temperature the "
                "tokens were sampled at."
            )
        n = len(r.prompt_ids) + len(r.response_ids)
        longest = max(longest, n)
        if limit is not None and n > int(limit):
            raise ValueError(
                f"record {i} has {n} tokens (prompt {len(r.prompt_ids)} + response {len(r.response_ids)}), past "
                f"the model's max_position_embeddings = {limit}: the model does not support those positions, so "
                "a mismatch there is not rounding. Was it produced by a model with a longer context (a different "
                "checkpoint or rope_scaling)?"
            )
    seen, unique, indices = set(), [], []
    for i, r in enumerate(records):
        k = _key(r)
        if k not in seen:
            seen.add(k)
            unique.append(r)
            indices.append(i)
    return InputCheck(unique, indices, len(records), len(records) - len(unique), longest)


def _engine_of(name: str) -> str | None:
    """The engine a record's ``engine`` field names, from the profile rows' data: a row name or an
    alias gives its ``calibration.engine``; the name of an engine some row was calibrated on is
    itself; anything else None (not known, so not checked)."""
    from rla.profiles.registry import alias_target, all_profiles

    rows = all_profiles()
    row = rows.get(alias_target(name) or name)
    if row is not None:
        return row.calibration.engine if row.calibration is not None else None
    engines = {p.calibration.engine for p in rows.values() if p.calibration is not None}
    return name if name in engines else None


def check_engine(records, profile) -> None:
    """Refuse records whose ``engine`` field names an engine other than ``profile``'s row (its
    ``calibration.engine``). Records rla's own sampler wrote name the profile they rounded like
    (a row name, ``"hf"``, ``"vllm-0.33"``); those are compared by rounding instead (a profile
    that increases the mismatch is the verdict's to say), so only an engine's name or alias is
    checked here."""
    from rla.profiles.registry import alias_target, all_profiles

    cal = getattr(profile, "calibration", None)
    if cal is None:
        return
    rows = all_profiles()
    for i, r in enumerate(records):
        if r.engine in rows and alias_target(r.engine) is None:
            continue  # a row name: rla's sampler rounding like that row
        said = _engine_of(r.engine)
        if said is not None and said != cal.engine:
            raise ValueError(
                f"record {i} (line {i + 1} of its rollout file), field 'engine': the records say {r.engine!r} "
                f"(engine {said!r}) but the profile {profile.name} is a row calibrated on {cal.engine!r} "
                f"{cal.version}: the rollouts did not come from that engine, so a mismatch against it says nothing "
                f"about rounding. Diagnose with the records' engine (--profile {r.engine}) or --profile auto."
            )
