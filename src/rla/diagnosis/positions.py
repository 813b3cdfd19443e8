"""Padding and position ids, read back from the logprobs: which layout were these tokens scored in?

A trainer (or a home-made rollout stack) that pads or numbers positions differently from the
engine scores the same tokens in another context. :func:`readings` scores the records under each
layout of :data:`READINGS` with the model in bf16, and :func:`check` compares a set of logprobs
(the records', or the trainer's own) with each reading and with the correct layout (right
padding, positions ``0..n-1``, pads masked), on the same records in the same micro-batch:

- ``restart_at_response``: the response's position ids restart at 0 (positions taken from the
  response mask, or prompt and response numbered apart); scored as a training forward without an
  attention mask scores it, which transformers reads as a packed sequence of its own;
- ``left_padded_unmasked``: left padding that the attention attends to (no attention mask; the
  pads sit at positions ``0..k-1``);
- ``left_padded_no_position_ids``: left padding without position ids: each row's positions start
  at its padding ``k`` instead of 0 (HF's default position ids when none are passed);
- ``positions_from_1``: ``cumsum(attention_mask)`` without the ``- 1``.

A row's padding ``k`` is what one left-padded micro-batch of the checked records gives it: the
longest checked record's length minus its own (a trainer's own batches are not in the records).

What size can and cannot show. The first two change what a token attends to: far beyond
rounding, so the reading that explains the logprobs stands out (``BETTER`` times closer than the
correct layout, within ``FACTOR`` x rounding's size). The last two shift a row's positions
uniformly, and RoPE depends only on relative positions: they move the logprobs by rounding alone
(the cos/sin of other angles; ``results/benchmarks/microbatch_bundled_cpu_2026-12-02``: left
padding without position ids gives k3 of the order of bf16 vs fp32). They are named only when the
reading is ``BETTER`` times closer than the correct layout, which happens when the logprobs come
from this stack (the trainer's own logprobs scored on this machine); against another stack's
logprobs both readings are rounding's size apart and the check says it cannot tell.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["READINGS", "CONTEXT", "VERDICTS", "layout", "readings", "check", "scale_in"]

READINGS = ("restart_at_response", "left_padded_unmasked", "left_padded_no_position_ids", "positions_from_1")
#: reading -> the triage verdict it gives
VERDICTS = {"restart_at_response": "position_ids", "left_padded_unmasked": "padding",
            "left_padded_no_position_ids": "position_ids", "positions_from_1": "position_ids"}


def _pad_id(config) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        v = getattr(config, name, None)
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, int):
            return v
    return 0


def layout(reading: str, records, pad_id: int = 0) -> tuple[list, list[list[int]] | None]:
    """``(records as the reading scores them, their position ids or None for 0..n-1)``."""
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; one of {READINGS}")
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
    pads = [max(lengths) - n for n in lengths]
    if reading == "restart_at_response":
        return records, [list(range(len(r.prompt_ids))) + list(range(len(r.response_ids))) for r in records]
    if reading == "positions_from_1":
        return records, [list(range(1, n + 1)) for n in lengths]
    if reading == "left_padded_no_position_ids":
        return records, [list(range(k, k + n)) for k, n in zip(pads, lengths)]
    return [dataclasses.replace(r, prompt_ids=[pad_id] * k + list(r.prompt_ids)) for r, k in zip(records, pads)], None


#: The readings that change what a token attends to (far beyond rounding when wrong).
CONTEXT = ("restart_at_response", "left_padded_unmasked")


def readings(bf16, records, logprobs, names=READINGS) -> tuple[list[np.ndarray], dict[str, list[np.ndarray] | None]]:
    """``(the correct layout's logprobs, {reading: its logprobs, or None where it changes nothing})``
    for the readings ``names``, all from one micro-batch each (``logprobs``:
    :func:`rla.rollout.train_logprobs.logprobs`)."""
    rows = lambda ts: [t.double().numpy() for t in ts]  # noqa: E731
    correct = rows(logprobs(bf16, records, max_tokens=10**9))
    pad = _pad_id(bf16.config)
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
    out = {}
    for name in names:
        padded = name.startswith("left_padded")
        if padded and len(set(lengths)) == 1:
            out[name] = None  # no row would be padded
            continue
        recs, pos = layout(name, records, pad)
        out[name] = rows(logprobs(bf16, recs, max_tokens=10**9, position_ids=pos))
    return correct, out


def check(subject, correct, alternatives, k3, scale: float, *, better: float, factor: float,
          scale_in=None) -> dict:
    """Compare ``subject`` (logprob rows of the checked records) with each reading.

    Returns ``{"k3_correct_layout", "k3_<reading>" (None: not scored), "best", "found"}``: ``found``
    is the best reading's name when it is ``better`` times closer than the correct layout and
    within ``factor`` x rounding's size, else None. Rounding's size is ``scale`` (measured in the
    correct layout); where the best reading is beyond ``factor`` x that, ``scale_in(reading)``
    (the bf16-vs-fp32 k3 in that layout) is asked for, once: a context the model never trained
    on (positions restarted) makes its logprobs less certain, and rounding moves them more there."""
    base = k3(correct, subject)
    ev = {"k3_correct_layout": base}
    best = None
    for name, rows in alternatives.items():
        ev[f"k3_{name}"] = None if rows is None else k3(rows, subject)
        if rows is not None and (best is None or ev[f"k3_{name}"] < ev[f"k3_{best}"]):
            best = name
    ev["best"] = best
    ok = best is not None and base > 0 and ev[f"k3_{best}"] * better <= base
    if ok and ev[f"k3_{best}"] > factor * scale and scale_in is not None:
        ev["rounding_scale_k3_in_best_layout"] = scale_in(best)
        scale = max(scale, ev["rounding_scale_k3_in_best_layout"])
    ev["found"] = best if ok and ev[f"k3_{best}"] <= factor * scale else None
    return ev


def scale_in(bf16, fp32, records, reading: str, logprobs, k3) -> float:
    """The bf16-vs-fp32 k3 of the records scored in ``reading``'s layout (rounding's size there)."""
    recs, pos = layout(reading, records, _pad_id(bf16.config))
    rows = lambda ts: [t.double().numpy() for t in ts]  # noqa: E731
    return k3(rows(logprobs(bf16, recs, max_tokens=10**9, position_ids=pos)), rows(logprobs(fp32, recs, position_ids=pos)))
