"""Training forwards of the recorded tokens, under a profile, with progress; shared by the diagnosis.

Each pass is :func:`rla.logprobs` (micro-batched by a token budget, a record longer than it run as
a chunked prefill where that is bit-identical, the LM head applied ``chunk`` positions at a time,
so memory stays bounded at any length the model supports) with a subset of the regions aligned.
Progress is reported per forward step (a micro-batch or one prefill chunk), so a long input never
runs silently for minutes. :class:`Sizes` carries the sizes through a diagnosis and records what
each pass did with long records.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

import rla.metrics as M
from rla.progress import Progress
from rla.rollout.train_logprobs import logprobs as train_logprobs

__all__ = ["forward_pass", "per_sequence_k3", "Sizes"]


@contextlib.contextmanager
def _aligned(model, profile, regions):
    from rla.alignment import aligned

    if not regions:
        yield
        return
    with aligned(model, profile=profile, regions=tuple(regions)):
        yield


@dataclass
class Sizes:
    """:func:`rla.logprobs`'s sizes for every pass of a diagnosis, and what the passes did."""

    max_tokens: int | None = None
    memory_budget: int | None = None
    passes: dict[str, dict] = field(default_factory=dict)
    """pass label -> :func:`rla.logprobs`'s ``info``, for passes with a record longer than max_tokens."""

    def summary(self) -> dict | None:
        """What the report states about long records: None when every record fit one forward step."""
        if not self.passes:
            return None
        first = next(iter(self.passes.values()))
        return {
            "max_tokens": first["max_tokens"],
            "chunk": first["chunk"],
            "memory_budget": self.memory_budget,
            "prefill_step": first["prefill_step"],
            "records_chunked": max(i["records_chunked"] for i in self.passes.values()),
            "records_one_call": max(i["records_one_call"] for i in self.passes.values()),
            "checks": {label: i["check"] for label, i in self.passes.items() if i["check"] is not None},
        }


def forward_pass(model, records, profile, regions, sizes, bar: Progress | None = None, what: str = "",
                 factors=None) -> np.ndarray:
    """[B, R] float64 training logprobs of the recorded tokens (0 at padding), ``regions`` aligned.

    ``sizes``: a :class:`Sizes` (or an int, the ``max_tokens``). ``factors``: temperature factors
    (:func:`rla.logprobs`' ``temperature_factors``); the result is then [B, R, len(factors)]."""
    if not isinstance(sizes, Sizes):
        sizes = Sizes(max_tokens=sizes)
    cb = bar.callback(f"  forward {what}".rstrip()) if bar is not None else None
    info: dict = {}
    with _aligned(model, profile, regions):
        rows = [t.double().numpy() for t in train_logprobs(model, records, max_tokens=sizes.max_tokens,
                                                           memory_budget=sizes.memory_budget, progress=cb, info=info,
                                                           temperature_factors=factors)]
    if info["records_chunked"] or info["records_one_call"]:
        sizes.passes[what or f"pass {len(sizes.passes)}"] = info
    if factors is None:
        return M.pad_rows(rows)[0]
    out = np.zeros((len(rows), max(len(r) for r in rows), len(factors)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def per_sequence_k3(pi: np.ndarray, mu: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """k3 of each sequence (mean of rho - 1 - delta over its tokens), delta = pi - mu."""
    d = np.where(mask, pi - mu, 0.0)
    return np.array([M.k3_terms(d[i][mask[i]]).mean() for i in range(mask.shape[0])])
