"""The optional ``top_logprobs`` field of a rollout record: the engine's distribution per token.

A record's ``logprobs`` give the engine's probability of the one token it sampled; a mismatch
measured on them sees the distribution only where it was sampled. Engines can return more: vLLM's
``SamplingParams(logprobs=k)`` the k most likely tokens per generated position (with the sampled
one), ``prompt_logprobs=k`` the same per prompt position, and ``logprobs=-1`` the whole vocabulary.
With them the train/rollout comparison is a KL over the vocabulary (SkyRL #2201;
``rla.metrics.vocab_kl``). Version 1::

    "top_logprobs": {"version": 1, "complete": false,
                     "response": [[[id, logprob], ...], ...],
                     "prompt": [[[id, logprob], ...], ...]}

* ``response``: one list per response token (the distribution its token was drawn from), each of
  ``[token_id, logprob]`` pairs, ids distinct and ``>= 0`` (``< vocab_size`` when the loader is
  given one), logprobs finite and ``<= 1e-6``, in the convention of the record's ``logprobs``
  (the engine's processed distribution: after temperature and top-k / top-p). Tokens of
  probability 0 (filtered out, ``-inf``) are left out.
* ``complete``: true when every position lists every token of non-zero probability (the engine
  returned the whole vocabulary); false when only its top k. A KL over complete lists is exact;
  over top-k lists it is a lower bound (``rla.metrics.vocab_kl`` says which).
* ``prompt`` (optional): one list per prompt token after the first (the first has no
  distribution), the same pairs.

A reader that does not know the version refuses the record (``rla.rollout.rollouts``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["VERSIONS", "check", "from_positions"]

VERSIONS = (1,)
_MAX_INT = 2**31 - 1
_TOL = 1e-6  # rla.rollout.rollouts.POSITIVE_LOGPROB_TOL


def _position(name: str, j: int, pairs: Any, vocab_size: int | None) -> list[list]:
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"'{name}'[{j}] must be a non-empty list of [token_id, logprob] pairs")
    out, seen = [], set()
    for p in pairs:
        ok = isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and not isinstance(p[0], bool)
        if not ok or not 0 <= p[0] <= (_MAX_INT if vocab_size is None else vocab_size - 1):
            raise ValueError(f"'{name}'[{j}] has {p!r}: pairs are [token_id >= 0"
                             + ("" if vocab_size is None else f" and < {vocab_size}") + ", logprob]")
        lp = p[1]
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > _TOL:
            raise ValueError(f"'{name}'[{j}] token {p[0]}: logprob {lp!r} is not a finite number <= {_TOL}")
        if p[0] in seen:
            raise ValueError(f"'{name}'[{j}] lists token {p[0]} twice")
        seen.add(p[0])
        out.append([p[0], float(lp)])
    return out


def check(v: Any, n_response: int, n_prompt: int, vocab_size: int | None = None) -> dict:
    """The field normalised (floats as float), or ``ValueError`` naming what is wrong."""
    if not isinstance(v, dict) or set(v) - {"version", "complete", "response", "prompt"} or "response" not in v:
        raise ValueError("expected an object with 'version', 'complete', 'response' and optionally 'prompt'")
    if isinstance(v.get("version"), bool) or v.get("version") not in VERSIONS:
        raise ValueError(f"version {v.get('version')!r} is not one this rla reads {VERSIONS}")
    if not isinstance(v.get("complete"), bool):
        raise ValueError(f"'complete' must be true or false, got {v.get('complete')!r}")
    out = {"version": v["version"], "complete": v["complete"]}
    for name, n in (("response", n_response), ("prompt", n_prompt - 1)):
        if name not in v:
            continue
        rows = v[name]
        if not isinstance(rows, list) or len(rows) != n:
            got = len(rows) if isinstance(rows, list) else type(rows).__name__
            what = "response token" if name == "response" else "prompt token after the first"
            raise ValueError(f"'{name}' must have one entry per {what} ({n}), got {got}")
        out[name] = [_position(name, j, pairs, vocab_size) for j, pairs in enumerate(rows)]
    return out


def from_positions(positions, *, offset: int = 0) -> list[list[list]]:
    """``[[token_id, logprob], ...]`` per position from vLLM's ``{token_id: Logprob}`` dicts (or
    FlatLogprobs' per-position views), ``-inf`` entries (probability 0) left out; ``offset``
    positions are skipped first (``prompt_logprobs``' leading None)."""
    out = []
    for pos in list(positions)[offset:]:
        pairs = []
        for tok, entry in pos.items():
            lp = float(getattr(entry, "logprob", entry))
            if lp != -math.inf:
                pairs.append([int(tok), lp])
        out.append(pairs)
    return out
