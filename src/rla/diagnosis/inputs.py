"""What the diagnosis checks in the rollouts before running any forward.

Two things rounding can never produce, found from the records and the model's config alone:

- **positions past ``max_position_embeddings``**: the model was not trained there (RoPE angles it
  never saw, a context window an engine would refuse); a mismatch there says nothing about
  rounding. Refused with the record and its length, before any forward.
- **duplicated records**: an exact copy (same prompt, response, logprobs and sampling settings)
  adds no information (the training forward is deterministic, so the copy's per-token deltas are
  the copy's) but it does add weight: ten copies of one sequence can decide a profile detection.
  Copies are counted once, and the report says how many were dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InputCheck", "check_records"]


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
