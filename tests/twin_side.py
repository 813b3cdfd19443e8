"""The twin tests' one comparison: a model (aligned to a row, or HF's own with ``None``) against a twin's output."""

from __future__ import annotations

import rla
from rla.engines.twin_compare import compare, hf_side


def twin_side(model, profile, out, ids, positions):
    """The model's side against ``out`` (``TwinOutput``: logits and per-layer stream) on ``ids`` at ``positions``,
    aligned to ``profile`` for the comparison (unaligned after it); ``None``: HF's model as it is."""
    if profile is not None:
        rla.align(model, profile)
    try:
        return compare((out.logits, out.layers), {"side": hf_side(model)}, ids, positions).sides[0]
    finally:
        if profile is not None:
            rla.unalign(model)
