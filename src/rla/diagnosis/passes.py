"""Training forwards of the recorded tokens, under a profile, with progress; shared by the diagnosis.

Each pass is :func:`rla.logprobs` (micro-batched by a token budget, the LM head applied
``chunk`` positions at a time, so memory stays bounded at any length the model supports) with a
subset of the regions aligned. Progress is reported per micro-batch, so a long input never runs
silently for minutes.
"""

from __future__ import annotations

import contextlib

import numpy as np

import rla.metrics as M
from rla.progress import Progress
from rla.rollout.train_logprobs import logprobs as train_logprobs

__all__ = ["forward_pass", "per_sequence_k3"]


@contextlib.contextmanager
def _aligned(model, profile, regions):
    from rla.alignment import aligned

    if not regions:
        yield
        return
    with aligned(model, profile=profile, regions=tuple(regions)):
        yield


def forward_pass(model, records, profile, regions, max_tokens, bar: Progress | None = None, what: str = "") -> np.ndarray:
    """[B, R] float64 training logprobs of the recorded tokens (0 at padding), ``regions`` aligned."""
    cb = bar.callback(f"  forward {what}".rstrip()) if bar is not None else None
    with _aligned(model, profile, regions):
        rows = [t.double().numpy() for t in train_logprobs(model, records, max_tokens=max_tokens, progress=cb)]
    return M.pad_rows(rows)[0]


def per_sequence_k3(pi: np.ndarray, mu: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """k3 of each sequence (mean of rho - 1 - delta over its tokens), delta = pi - mu."""
    d = np.where(mask, pi - mu, 0.0)
    return np.array([M.k3_terms(d[i][mask[i]]).mean() for i in range(mask.shape[0])])
